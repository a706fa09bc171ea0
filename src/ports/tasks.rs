//! The task store port: the guard's read, the claim and its lease, and the one terminal
//! write with its run's count. It uses domain types only.

use std::future::Future;
use std::time::SystemTime;

use crate::domain::ids::TaskRef;
use crate::domain::model::{Parents, Task, TaskStatus, Terminal};
use crate::domain::refresh::Prior;
use crate::domain::spend::CountedIn;
use crate::ports::error::StoreError;

use crate::domain::bounds::Reason;
pub use crate::domain::model::{Lease, Tries, TriesFrom};

/// The result of trying to move a task to `processing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This delivery may work on the task. `attempts` counts the claims so far, this one
    /// included. `url` is the task's URL, and `prior` its earlier result if it refreshes
    /// one. `tries` is the task's set of tries as the claim found it.
    Claimed {
        attempts: u32,
        was: TaskStatus,
        url: Option<String>,
        prior: Option<Prior>,
        tries: Tries,
    },
    /// The task became terminal since the guard read it.
    AlreadyTerminal,
    /// The task item is gone.
    Missing,
    /// Another invocation holds a live lease on the task until then.
    Leased { until: SystemTime },
}

/// The result of the terminal write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The task is terminal and counted. `completed_run` is true when it was its run's last
    /// task. `spend_counted` is true when the delivery's spend was added in the same write.
    Written {
        completed_run: bool,
        spend_counted: bool,
    },
    /// Another delivery made the terminal write first. The task is left as that one wrote it.
    LostRace,
}

/// Where tasks, jobs and runs live. Each method is one request.
pub trait TaskStore: Send + Sync {
    /// The guard's read: the task, or `None` when it is gone.
    fn load_task(
        &self,
        task: &TaskRef,
    ) -> impl Future<Output = Result<Option<Task>, StoreError>> + Send;

    /// The statuses of the task's job and run.
    fn load_parents(
        &self,
        task: &TaskRef,
    ) -> impl Future<Output = Result<Parents, StoreError>> + Send;

    /// Moves a pending or processing task to processing, and counts the attempt in the set
    /// of tries that `tries` names. A fresh set starts at one. With a lease, it does so only
    /// if no other invocation holds a live lease, and then takes the lease.
    fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
        tries: TriesFrom,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Marks an open task's tries as spent. Its final attempt failed for a reason on our side
    /// (`reason`). So its messages are no longer parked, but go to the dead-letter queue.
    fn spend_tries(
        &self,
        task: &TaskRef,
        reason: &Reason,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives up this delivery's lease, if it still holds it. This is for a delivery that ends
    /// without a terminal write, so the next one need not wait for the lease to expire.
    fn release(
        &self,
        task: &TaskRef,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back the attempt a claim counted, and the status it found (`was`), when no
    /// fetch followed the claim: the host pushed back meanwhile, or no time was left. Only
    /// while the task is still processing. The lease of `owner`, if it holds one, is given
    /// up too.
    fn unclaim(
        &self,
        task: &TaskRef,
        was: TaskStatus,
        owner: Option<&str>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The one terminal write. Only a task still pending or processing can take it, with
    /// one exception: a stored result may replace a failure that has no result. That is a
    /// success that raced a failure and lost the write, and a stored result always wins. In
    /// the same write, the delivery's `spend`, when there is one, is added to the counter the
    /// task counts in, and the delivery is named on the task.
    fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        counted: CountedIn<'_>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Finish, StoreError>> + Send;
}
