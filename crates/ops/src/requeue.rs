//! `conveyor-ops requeue-failed`: sets a run's failed tasks back to pending, with the run's
//! counters, and sends one message for each. This reopens a completed run. A cancelled run
//! is never re-queued.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use conveyor_worker::domain::ids::RunRef;
use conveyor_worker::domain::ids::{Id, TaskRef};
use conveyor_worker::domain::model::Counting;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::pushback::retry::{Patience, RetryPolicy};
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::attributes::string;
use conveyor_worker::store::dynamo::runs::{Requeue, counting_of, spread_of};
use conveyor_worker::store::sqs::SqsQueue;

/// What a re-queue did.
#[derive(Debug, Default)]
pub struct Requeued {
    /// Failed tasks set back to pending, with the run's counters.
    pub reset: Vec<String>,
    /// Task ids sent to the queue.
    pub sent: Vec<String>,
    /// Task ids whose message could not be sent. Re-run with `resend_open` to send them.
    pub unsent: Vec<String>,
    /// Failed tasks left failed because concurrent writes kept conflicting with the reset.
    /// Re-run to re-queue them.
    pub conflicted: Vec<String>,
    /// Why the re-queue stopped before the run's last task: an error, or the operator's
    /// interrupt. Every task reset before that was still sent its message.
    pub stopped: Option<String>,
}

/// How many tasks are reset before their messages are sent. A failure or an interrupt
/// between the two leaves at most this many pending without a message (`--resend-open`
/// sends them).
const RESET_AHEAD: usize = 10;

/// How long, and how often, one task's reset is tried again while it conflicts with
/// concurrent writes. An operator can wait longer than an invocation.
const RESET_PATIENCE: Duration = Duration::from_secs(20);
const RESET_RETRIES: RetryPolicy = RetryPolicy {
    attempts: 12,
    base: Duration::from_millis(50),
    max_pause: Duration::from_secs(2),
};

/// Sets the run's failed tasks back to pending, and sends one message per task, each ten
/// right after their resets. Each reset updates its run's or counter shard's count in the
/// same transaction, so a task is never counted twice. With `resend_open`, tasks not ended
/// (pending, or processing with their message gone) are sent again too. A duplicate is
/// harmless, because the worker converges. A cancelled run is left alone. An error, or
/// `stop` turning true, ends it early ([`Requeued::stopped`] says why), once the resets
/// made so far are sent.
pub async fn requeue_failed(
    tasks: &DynamoTaskStore,
    queue: &SqsQueue,
    run: RunRef<'_>,
    resend_open: bool,
    stop: &AtomicBool,
) -> Result<Requeued, StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let (counting, spread) = requeueable(tasks, run).await?;
    let mut requeued = Requeued::default();
    let mut to_send = Vec::new();
    for (task, item) in tasks.run_tasks(job, run_id).await? {
        if stop.load(Ordering::Relaxed) {
            requeued.stopped = Some("interrupted".into());
            break;
        }
        let task_ref = match task_ref(job, run_id, &task) {
            Ok(task_ref) => task_ref.spread_over(spread),
            Err(err) => {
                requeued.stopped = Some(err.to_string());
                break;
            }
        };
        match string(&item, "status") {
            Some("failed") => match reset(tasks, &task_ref, counting).await {
                Ok(Requeue::Done) => {
                    requeued.reset.push(task);
                    to_send.push(task_ref);
                }
                Ok(Requeue::NotFailed) => {}
                Err(err) if err.is_conflict() => requeued.conflicted.push(task),
                Err(err) => {
                    requeued.stopped = Some(format!("{task}: {err}"));
                    break;
                }
            },
            Some("pending" | "processing") if resend_open => to_send.push(task_ref),
            _ => {}
        }
        if to_send.len() == RESET_AHEAD {
            send(queue, &std::mem::take(&mut to_send), &mut requeued).await;
        }
    }
    send(queue, &to_send, &mut requeued).await;
    Ok(requeued)
}

/// The run's counting and spread (v3), if it may be re-queued: it exists and is not
/// cancelled.
async fn requeueable(
    tasks: &DynamoTaskStore,
    run: RunRef<'_>,
) -> Result<(Option<Counting>, Option<u32>), StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let item = tasks
        .run_item(job, run_id)
        .await?
        .ok_or_else(|| StoreError::NotAllowed {
            detail: format!("run {job}/{run_id} does not exist"),
        })?;
    if string(&item, "status") == Some("cancelled") {
        return Err(StoreError::NotAllowed {
            detail: format!("run {job}/{run_id} is cancelled"),
        });
    }
    Ok((counting_of(&item), spread_of(&item)))
}

/// One task's reset, tried again while a concurrent transaction holds it or its run.
async fn reset(
    tasks: &DynamoTaskStore,
    task: &TaskRef,
    counting: Option<Counting>,
) -> Result<Requeue, StoreError> {
    let conflicts = AtomicU64::new(0);
    let until = Instant::now() + RESET_PATIENCE;
    Patience::new(until, RESET_RETRIES, &conflicts)
        .retry(|| tasks.requeue_failed(task, counting))
        .await
}

/// One message per task, ten to a request. What SQS did not take is listed as unsent.
async fn send(queue: &SqsQueue, tasks: &[TaskRef], requeued: &mut Requeued) {
    for chunk in tasks.chunks(10) {
        let ids = |tasks: &[TaskRef]| {
            tasks
                .iter()
                .map(|t| t.task_id.to_string())
                .collect::<Vec<_>>()
        };
        match queue.send_tasks(chunk).await {
            Ok(unsent) => {
                let unsent = ids(&unsent);
                let sent = ids(chunk).into_iter().filter(|t| !unsent.contains(t));
                requeued.sent.extend(sent);
                requeued.unsent.extend(unsent);
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not send the messages");
                requeued.unsent.extend(ids(chunk));
            }
        }
    }
}

fn task_ref(job: &Id, run: &Id, task: &str) -> Result<TaskRef, StoreError> {
    let task_id = Id::parse(task).map_err(|e| StoreError::Corrupt {
        what: "task id",
        detail: format!("{task:?}: {e}"),
    })?;
    Ok(TaskRef::new(job.clone(), run.clone(), task_id))
}
