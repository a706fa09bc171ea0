//! Re-queueing a failed task in a run's counter tree (data contract v2). The task goes back
//! to pending and into its shard's count in one transaction. This reopens the shard, its
//! group and the run when they had none left.

use aws_sdk_dynamodb::types::Update;

use super::{Node, Path, condition_refused, writes};
use crate::domain::ids::TaskRef;
use crate::domain::model::Sharding;
use crate::ports::error::StoreError;
use crate::store::dynamo::attributes::number;
use crate::store::dynamo::shards;
use crate::store::dynamo::{DynamoTaskStore, keys, tasks};

/// How a re-queue of one failed task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Back to pending, and counted back into its run.
    Done,
    /// The task was not failed any more when the write landed.
    NotFailed,
}

/// A re-queue's transaction: the task, and its counters up to `top`. Each counter below
/// `top` is reopened from none left. `top` counts the task back. If `top` is the run, the
/// run runs again.
fn reopen_updates(table: &str, path: &Path<'_>, top: usize, now: &str) -> Vec<Update> {
    let task = tasks::writes::requeue_task(now).into_update(table, keys::task_key(path.task));
    let counters = (0..=top).map(|level| {
        let reopens = level < top;
        let update = match path.nodes[level] {
            Node::Shard(_) => writes::shard_requeue(now, reopens),
            Node::Group(_) => writes::group_requeue(now, reopens),
            Node::Run => writes::children_reopened(path.left(level), now),
        };
        update.into_update(table, path.key(level))
    });
    std::iter::once(task).chain(counters).collect()
}

fn counters_refused(task: &TaskRef) -> StoreError {
    let (job, run) = (&task.job_id, &task.run_id);
    StoreError::NotAllowed {
        detail: format!("run {job}/{run} was cancelled or lost its counters"),
    }
}

/// A failed task back to pending, and back into its shard's count, in one transaction.
/// A shard that had none left reopens in its group (or the run). A group that had none
/// left reopens in the run, and the run runs again. A run cancelled meanwhile is refused.
pub(crate) async fn requeue_sharded(
    store: &DynamoTaskStore,
    task: &TaskRef,
    sharding: Sharding,
    now: &str,
) -> Result<Requeue, StoreError> {
    let path = Path::of(task, sharding);
    let mut top = 0;
    for _ in 0..2 * path.nodes.len() {
        let updates = reopen_updates(&store.table, &path, top, now);
        let Err(err) = shards::transact(store, updates).await else {
            return Ok(Requeue::Done);
        };
        let (at, old) = condition_refused(err, "TransactWriteItems(requeue)")?;
        let Some(level) = at.checked_sub(1) else {
            return Ok(Requeue::NotFailed);
        };
        let left = old
            .as_ref()
            .and_then(|item| number::<i64>(item, path.left(level)));
        top = match (path.nodes[level], left) {
            (Node::Run, _) | (_, None) => return Err(counters_refused(task)),
            (_, Some(0)) => level + 1, // none left: it reopens, and its parent with it
            (_, Some(_)) => level,
        };
    }
    Err(StoreError::Changed {
        detail: format!("the counters of {} kept changing", task.task_id),
    })
}
