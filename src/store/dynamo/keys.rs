//! The table's key scheme, in one place. Keys are the strings `pk` and `sk`.
//!
//! - A run's tasks share one partition (`RUN#<job>#<run>`). In data contract v3 they spread
//!   over one partition per counter shard (`RUN#<job>#<run>#<shard>`).
//! - A job and its runs share the job's partition (`JOB#<job>`).
//! - Each counter shard and counter group of a run has a partition of its own
//!   (`SHARD#<job>#<run>#<n>`, `GROUP#<job>#<run>#<n>`).
//! - So does each host the fleet fetches from (`HOST#<host:port>`).
//! - The sandboxes' leases on a run's paid-tier budget share one partition
//!   (`LEASES#<job>#<run>`).

use crate::domain::ids::{Id, TaskRef};
use crate::store::dynamo::attributes::{Item, s};

/// The job item's sort key, in its own partition.
pub const JOB_SORT: &str = "JOB";

/// The partition of a run's tasks: the run's single partition (v1, v2), or the shard's (v3).
pub fn tasks_partition(job: &Id, run: &Id, shard: Option<u32>) -> String {
    match shard {
        None => format!("RUN#{job}#{run}"),
        Some(shard) => format!("RUN#{job}#{run}#{shard}"),
    }
}

/// Every partition a run's tasks are under: one, or one per counter shard (v3, `spread`).
pub fn task_partitions(job: &Id, run: &Id, spread: Option<u32>) -> Vec<String> {
    match spread {
        None => vec![tasks_partition(job, run, None)],
        Some(shards) => (0..shards)
            .map(|shard| tasks_partition(job, run, Some(shard)))
            .collect(),
    }
}

pub fn task_sort(task: &Id) -> String {
    format!("TASK#{task}")
}

pub fn job_partition(job: &Id) -> String {
    format!("JOB#{job}")
}

pub fn run_sort(run: &Id) -> String {
    format!("RUN#{run}")
}

/// The task id in a task item's sort key.
pub fn task_of_sort(sort: &str) -> Option<&str> {
    sort.strip_prefix("TASK#")
}

/// A host's items (its schedule `HOST`, its robots.txt `ROBOTS`), in a partition of its own.
pub fn host_key(host: &str, sort: &str) -> Item {
    key(format!("HOST#{host}"), sort.into())
}

/// An item's key.
pub fn key(pk: String, sk: String) -> Item {
    Item::from([("pk".to_owned(), s(&pk)), ("sk".to_owned(), s(&sk))])
}

pub fn task_key(task: &TaskRef) -> Item {
    key(
        tasks_partition(&task.job_id, &task.run_id, task.shard()),
        task_sort(&task.task_id),
    )
}

pub fn job_key(job: &Id) -> Item {
    key(job_partition(job), JOB_SORT.into())
}

pub fn run_key(job: &Id, run: &Id) -> Item {
    key(job_partition(job), run_sort(run))
}

/// A sandbox's lease on the run's paid-tier budget, in a partition for the run's leases.
/// One Query finds them all, and the run item stays in its job's partition.
pub fn lease_key(job: &Id, run: &Id, holder: &str) -> Item {
    key(lease_partition(job, run), format!("LEASE#{holder}"))
}

pub fn lease_partition(job: &Id, run: &Id) -> String {
    format!("LEASES#{job}#{run}")
}

/// The sort key of a counter shard item.
pub const SHARD_SORT: &str = "SHARD";

/// Counter shard `shard` of the run, in a partition of its own, so shards do not share a
/// partition's write capacity.
pub fn shard_key(job: &Id, run: &Id, shard: u32) -> Item {
    key(format!("SHARD#{job}#{run}#{shard}"), SHARD_SORT.into())
}

/// The sort key of a counter group item.
pub const GROUP_SORT: &str = "GROUP";

/// Counter group `group` of the run, in a partition of its own.
pub fn group_key(job: &Id, run: &Id, group: u32) -> Item {
    key(format!("GROUP#{job}#{run}#{group}"), GROUP_SORT.into())
}
