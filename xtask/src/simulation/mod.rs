//! A discrete-event simulation of one run's progress at fleet speed: DynamoDB's partitions
//! (capacity per second, transactions at twice the cost, overlapping transactions cancelled)
//! fed with the worker's own requests per task, for a run counted on its item (data contract
//! v1) or in counter shards (v2), and a fresh run's wider limits (`capacity`: a new table's
//! rate, splits for heat, S3 prefixes, the event source mapping's scaling). `make bench`
//! runs it; docs/performance.md says what it assumes and where it could be wrong.

pub mod capacity;
pub mod clock;
pub mod dynamo;
mod fleet;
pub mod fresh;
pub mod fresh_report;
mod held;
pub mod host;
pub mod pace;
mod places;
pub mod report;

use capacity::Mapping;
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

/// Where a run's task items and results are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Data contracts v1 and v2: the run's task items share one partition key (split for
    /// heat), its results one S3 prefix.
    OneKey,
    /// v3: task items over `keys` partition keys (the task's counter shard in its key),
    /// results over 256 prefixes.
    Spread { keys: u32 },
}

/// A fresh run's surroundings: the table as created, the mapping's scaling, the layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fresh {
    /// The table's warm throughput, read and write units a second (0: a new table's start).
    pub warm_read: f64,
    pub warm_write: f64,
    pub mapping: Mapping,
    pub layout: Layout,
    /// How long a hot task key, and a hot S3 prefix, is hot before it splits (seconds).
    pub split_delay_s: f64,
    pub prefix_delay_s: f64,
    /// S3 prefixes the results spread over (1 in v1/v2, 256 in v3).
    pub prefixes: u32,
    /// Throttling lets a request pass while any units are left (see `Table::debt`).
    pub debt: bool,
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
    /// A fresh run's limits (`None`: the table and S3 never the limit, the fleet all there).
    pub fresh: Option<Fresh>,
    /// Each sandbox's records at once under AWS push-back, as the worker keeps them
    /// (`pushback/pressure.rs`: halved on a push-back at most once a second, +1/limit per record
    /// counted); off: every slot always works.
    pub aimd: bool,
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
            fresh: None,
            aimd: true,
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
    /// Completions in each 10 s of the run (from its start, warm-up included).
    pub timeline: Vec<u64>,
    /// Write and read units granted, and S3 PUTs taken, per completed task.
    pub write_units_per_task: f64,
    pub read_units_per_task: f64,
    pub puts_per_task: f64,
    /// PUTs answered 503 SlowDown per completed task (in `throttled_per_task` too).
    pub slow_downs_per_task: f64,
    /// Records dead-lettered (their copies spent).
    pub dead_letters: u64,
    /// When the task key, and the (first) S3 prefix, split (seconds).
    pub key_splits: Vec<f64>,
    pub prefix_splits: Vec<f64>,
}

/// Seconds in one bin of `Outcome::timeline`.
pub const TIMELINE_BIN_S: u64 = 10;

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
