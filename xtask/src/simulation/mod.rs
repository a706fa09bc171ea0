//! A discrete-event simulation of one run's progress at fleet speed: DynamoDB's partitions
//! (capacity per second, transactions at twice the cost, overlapping transactions cancelled)
//! fed with the worker's own requests per task, for a run counted on its item (data contract
//! v1) or in counter shards (v2). `make bench` runs it; docs/performance.md says what it
//! assumes and where it could be wrong.

pub mod dynamo;
mod fleet;
pub mod host;
pub mod report;

use dynamo::Micros;

/// How the simulated run counts its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Every terminal write also writes the run item (data contract v1).
    RunItem,
    /// Each terminal write counts into one of `shards` (v2); with `groups` (0: none), a
    /// shard's last task counts it done in its group, a group's last in the run.
    Shards { shards: u32, groups: u32 },
}

/// One simulated situation.
#[derive(Debug, Clone)]
pub struct Params {
    /// Tasks of the run in flight at once (the fleet's records in flight on it).
    pub in_flight: u32,
    pub counting: Counting,
    /// The run's tasks; `None`: a run that does not end in the simulated time (steady state).
    pub tasks: Option<u64>,
    /// Simulated time; a run with `tasks` stops when it completes.
    pub seconds: f64,
    /// Seconds at the start left out of the figures.
    pub warmup: f64,
    /// How long a transaction holds its items, prepare to commit (not documented by AWS).
    pub hold_ms: f64,
    /// The worker's PARENTS_TTL_MS; `None`: the job and run read for every task.
    pub parents_ttl_ms: Option<f64>,
    /// The partitions of the run's tasks (one partition key); `None`: once DynamoDB has
    /// split it for heat, never the limit.
    pub task_partitions: Option<u32>,
    /// DynamoDB's limits (partition capacity, transactions cancelled); without them, the
    /// floor: each task takes its own time alone.
    pub limits: bool,
    /// Records in flight per Lambda sandbox (one batch of 10).
    pub per_sandbox: u32,
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            in_flight: 1_000,
            counting: Counting::RunItem,
            tasks: None,
            seconds: 40.0,
            warmup: 10.0,
            hold_ms: 5.0,
            parents_ttl_ms: Some(5_000.0),
            task_partitions: None,
            limits: true,
            per_sandbox: 10,
            seed: 1,
        }
    }
}

/// What a simulation measured (after the warm-up, for a steady state; over the whole run
/// for a run that ends).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub completions_per_second: f64,
    /// Transactions cancelled by a conflict, of all transactions tried.
    pub conflict_rate: f64,
    /// Requests throttled by a partition, per completed task.
    pub throttled_per_task: f64,
    /// AWS requests per completed task (throttled and cancelled ones included).
    pub requests_per_task: f64,
    /// Read and write units a second on the job's partition (the job and run items).
    pub job_reads_per_second: f64,
    pub job_writes_per_second: f64,
    /// When the run completed (a run with `tasks`).
    pub completed_at: Option<f64>,
}

/// Runs one simulation.
pub fn simulate(params: &Params) -> Outcome {
    fleet::Fleet::new(params).run()
}

fn micros(seconds: f64) -> Micros {
    (seconds * dynamo::SECOND as f64) as Micros
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(in_flight: u32, counting: Counting) -> Outcome {
        simulate(&Params {
            in_flight,
            counting,
            seconds: 8.0,
            warmup: 3.0,
            ..Params::default()
        })
    }

    #[test]
    fn a_run_item_saturates_at_its_partition_and_a_counter_tree_keeps_up() {
        let tree = Counting::Shards {
            shards: 4_096,
            groups: 64,
        };

        let item = steady(2_000, Counting::RunItem);
        let sharded = steady(2_000, tree);

        // 1,000 write units a second, two a transaction: 500 at most, fewer with conflicts.
        assert!(item.completions_per_second < 500.0, "{item:?}");
        // 2,000 tasks of about 0.95 s each in flight: about 2,100 a second.
        assert!(sharded.completions_per_second > 1_900.0, "{sharded:?}");
        assert!(sharded.conflict_rate < 0.01, "{sharded:?}");
    }

    #[test]
    fn a_whole_run_is_completed_once_every_task_is_counted() {
        let params = Params {
            in_flight: 500,
            counting: Counting::Shards {
                shards: 64,
                groups: 4,
            },
            tasks: Some(5_000),
            seconds: 600.0,
            warmup: 0.0,
            ..Params::default()
        };

        let outcome = simulate(&params);
        let floor = simulate(&Params {
            limits: false,
            ..params.clone()
        });

        let (at, floor_at) = (outcome.completed_at.unwrap(), floor.completed_at.unwrap());
        assert!(
            at >= floor_at && at < floor_at * 1.2,
            "{at} against {floor_at}"
        );
        assert_eq!(floor.conflict_rate, 0.0);
    }

    #[test]
    fn reading_the_parents_for_every_task_is_bound_by_the_job_partition() {
        let params = Params {
            in_flight: 4_000,
            counting: Counting::Shards {
                shards: 1_024,
                groups: 16,
            },
            parents_ttl_ms: None,
            seconds: 8.0,
            warmup: 3.0,
            ..Params::default()
        };

        let outcome = simulate(&params);

        // 3,000 read units a second, two items a read.
        assert!(outcome.completions_per_second <= 1_550.0, "{outcome:?}");
        assert!(
            outcome.job_reads_per_second <= 3_000.0 * 1.01,
            "{outcome:?}"
        );
    }
}
