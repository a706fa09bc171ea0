//! The task store's port: the guard's read, the claim and its lease, and the one terminal
//! write with its run's count, in domain types only.

use std::future::Future;
use std::time::SystemTime;

use crate::domain::ids::TaskRef;
use crate::domain::model::{Counting, Parents, Task, TaskStatus, Terminal};
use crate::domain::refresh::Prior;
use crate::domain::spend::DeliverySpend;
use crate::ports::error::StoreError;

use crate::domain::bounds::Reason;
pub use crate::domain::model::{Lease, Tries, TriesFrom};

/// The result of trying to move a task to `processing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This delivery may work on the task; `attempts` counts the claims so far, this one
    /// included; `url` is the task's, and `prior` its earlier result if it refreshes one;
    /// `tries`: the task's set of tries as the claim found it.
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
    /// The task is terminal and counted; `completed_run` when it was its run's last task;
    /// `spend_counted` when the delivery's spend was added in the same write.
    Written {
        completed_run: bool,
        spend_counted: bool,
    },
    /// Another delivery made the terminal write first; the task is left as it made it.
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

    /// Moves a pending or processing task to processing, counting the attempt in the set of
    /// tries `tries` names (a fresh set starts at one); with a lease, only if no other
    /// invocation holds a live one, and takes it.
    fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
        tries: TriesFrom,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Marks an open task's tries spent: its final attempt failed for a reason of ours
    /// (`reason`), so its messages are no longer parked, but go to the dead-letter queue.
    fn spend_tries(
        &self,
        task: &TaskRef,
        reason: &Reason,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives up this delivery's lease, if it still holds it (a delivery that ends without a
    /// terminal write, so the next one need not wait for the lease to expire).
    fn release(
        &self,
        task: &TaskRef,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back the attempt a claim counted, and the status it found (`was`), when no
    /// fetch followed it (the host pushed back meanwhile, no time was left): only while the
    /// task is still processing. The lease of `owner`, if it holds one, goes with it.
    fn unclaim(
        &self,
        task: &TaskRef,
        was: TaskStatus,
        owner: Option<&str>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The one terminal write: only a task still pending or processing can take it, except
    /// that a stored result may replace a failure that has none (a success that raced a
    /// failure and lost the write: a stored result always wins). The delivery's `spend` is
    /// added to the counter the task counts in, in the same write, when there is one, and
    /// the delivery named on the task with it.
    fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        counter: (Counting, DeliverySpend<'_>),
        now: SystemTime,
    ) -> impl Future<Output = Result<Finish, StoreError>> + Send;
}
