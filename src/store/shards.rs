//! Counting a task into one of its run's counter shards (data contract v2): the terminal
//! write and the shard's count in one transaction, as with a run's own counters, and the
//! shard's last task also counting the shard done on the run, whose last shard completes it.
//! The run item is written once per shard, not once per task. The argument that this
//! completes a run exactly once is in docs/design.md.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::domain::ids::TaskRef;
use crate::domain::model::{TaskStatus, Terminal, shard_of};
use crate::store::attributes::{Item, number, string};
use crate::store::error::{AwsError, cancellation_fault};
use crate::store::expressions::{self, Over, RunStep};
use crate::store::keys;
use crate::store::tasks::{DynamoTaskStore, Finish, cancellation_codes, is_failure_without_result};

/// How the terminal write counts the task into its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardStep {
    /// More than one task of the shard remains: count this one.
    Count,
    /// The shard's last task: count it, and the shard done on the run (`RunStep` as for a
    /// run's own count: one shard fewer, the last completing it, or not running).
    Last(RunStep),
    /// The shard's last task of a run that is gone: count it in the shard alone.
    LastWithoutRun,
    /// A success replacing a failure the shard counted.
    Recount,
}

/// How a sharded terminal write's transaction ended.
enum Counted {
    Written,
    /// The task is terminal already: was it failed without a result?
    TaskRefused {
        failed_without_result: bool,
    },
    /// The shard or the run was not as the step expected: the next step, from what they
    /// were (None: the shard is gone or had nothing left to count).
    Refused(Option<ShardStep>),
}

impl DynamoTaskStore {
    /// The terminal write, counted into the task's shard among `shards`.
    pub(crate) async fn finish_sharded(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: &str,
        shards: u32,
    ) -> Result<Finish, AwsError> {
        let shard = shard_of(&task.task_id, shards);
        let mut step = ShardStep::Count;
        // Each refusal says what the shard and run are now; a few steps always suffice
        // unless they keep changing underneath, which is a conflict to try again.
        for _ in 0..4 {
            let next = match self
                .count_in_shard(task, terminal, now, shard, step)
                .await?
            {
                Counted::Written => return Ok(written(step)),
                Counted::TaskRefused {
                    failed_without_result: true,
                } if terminal.status() == TaskStatus::Successful => ShardStep::Recount,
                Counted::TaskRefused { .. } => return Ok(Finish::LostRace),
                Counted::Refused(Some(next)) => next,
                Counted::Refused(None) => return self.uncounted(task, terminal, now, step).await,
            };
            step = next;
        }
        Err(AwsError::Conflict {
            detail: format!("shard {shard} of the run kept changing under the terminal write"),
        })
    }

    /// One transaction: the task, its shard, and (for the shard's last task) the run.
    async fn count_in_shard(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: &str,
        shard: u32,
        step: ShardStep,
    ) -> Result<Counted, AwsError> {
        let (job, run) = (&task.job_id, &task.run_id);
        let over = match step {
            ShardStep::Recount => Over::FailureWithoutResult,
            _ => Over::Open,
        };
        let shard_update = match step {
            ShardStep::Count => expressions::shard_count(terminal, now, false),
            ShardStep::Last(_) | ShardStep::LastWithoutRun => {
                expressions::shard_count(terminal, now, true)
            }
            ShardStep::Recount => expressions::shard_recount(terminal, now),
        };
        let mut items = vec![
            expressions::task_terminal(terminal, now, over)
                .into_update(&self.table, keys::task_key(task)),
            shard_update.into_update(&self.table, keys::shard_key(job, run, shard)),
        ];
        if let ShardStep::Last(run_step) = step {
            let done = expressions::shard_done(run_step, now);
            items.push(done.into_update(&self.table, keys::run_key(job, run)));
        }
        let items = items
            .into_iter()
            .map(|u| TransactWriteItem::builder().update(u).build());
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items.collect()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Counted::Written),
            Err(err) => refusal(err, step),
        }
    }

    /// The terminal write without a count, for a task whose shard is gone or counted all
    /// its tasks already (a producer's mistake in sizing it): the task still ends.
    async fn uncounted(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: &str,
        step: ShardStep,
    ) -> Result<Finish, AwsError> {
        tracing::warn!(
            ?step,
            "the task's counter shard is gone or has nothing left to count"
        );
        let over = match step {
            ShardStep::Recount => Over::FailureWithoutResult,
            _ => Over::Open,
        };
        self.finish_uncounted(task, terminal, now, over).await
    }
}

fn written(step: ShardStep) -> Finish {
    let completed_run = step == ShardStep::Last(RunStep::CountAndComplete);
    if completed_run {
        tracing::info!("the run is complete");
    }
    Finish::Written { completed_run }
}

/// A cancelled sharded terminal write: whose condition failed, and the step the items as
/// they are call for.
fn refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
    step: ShardStep,
) -> Result<Counted, AwsError> {
    let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    else {
        return Err(AwsError::from_sdk("TransactWriteItems(finish)", err));
    };
    let reasons = cancelled.cancellation_reasons();
    let codes = cancellation_codes(reasons);
    if let Some(fault) = cancellation_fault(&codes) {
        return Err(AwsError::aws("TransactWriteItems(finish)", fault, err));
    }
    let old = |i: usize| reasons.get(i).and_then(|r| r.item());
    match codes.as_slice() {
        ["ConditionalCheckFailed", ..] => Ok(Counted::TaskRefused {
            failed_without_result: old(0).is_some_and(is_failure_without_result),
        }),
        [_, "ConditionalCheckFailed", ..] => Ok(Counted::Refused(shard_step(old(1), step))),
        [_, _, "ConditionalCheckFailed"] => Ok(Counted::Refused(Some(run_step(old(2))))),
        _ => Err(AwsError::from_sdk("TransactWriteItems(finish)", err)),
    }
}

/// The step a shard as it is calls for: count, or count its last task.
fn shard_step(shard: Option<&Item>, step: ShardStep) -> Option<ShardStep> {
    match (
        shard.and_then(|s| number::<i64>(s, "tasks_remaining")),
        step,
    ) {
        (_, ShardStep::Recount) => None,
        (Some(left), _) if left > 1 => Some(ShardStep::Count),
        (Some(1), _) => Some(ShardStep::Last(RunStep::Count)),
        _ => None,
    }
}

/// The run's side a run as it is calls for, when its shard counts its last task.
fn run_step(run: Option<&Item>) -> ShardStep {
    let Some(run) = run.filter(|r| !r.is_empty()) else {
        return ShardStep::LastWithoutRun;
    };
    let left: Option<i64> = number(run, "shards_remaining");
    match (left, string(run, "status")) {
        (None, _) => ShardStep::LastWithoutRun,
        (Some(left), _) if left > 1 => ShardStep::Last(RunStep::Count),
        (Some(1), Some("running")) => ShardStep::Last(RunStep::CountAndComplete),
        _ => ShardStep::Last(RunStep::CountOnly),
    }
}
