//! Counting a task in its run's own counters (data contract v1). The terminal write and the
//! run item's count go in one transaction, and the last task's transaction also completes
//! the run. A success that replaces a failure without a result is counted again, as a
//! success. This module also holds the run's side of a re-queue.
//!
//! Every file of the run progress feature: the rules in `domain/model.rs` (`Counting`,
//! `Sharding`); the counts written with the terminal write here (v1) and in `../shards/`
//! (v2, v3); the run's item in `../runs/`; the count chosen per task in
//! `worker/converge/stores.rs`; the operator's view in `crates/ops/`
//! (`progress.rs`, `bin/conveyor-ops/progress.rs`), its counters made by `submit.rs` and
//! re-queued by `requeue.rs` there. docs/design.md#run-progress says why it completes once.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::domain::ids::TaskRef;
use crate::domain::model::{TaskStatus, Terminal};
use crate::domain::spend::DeliverySpend;
use crate::ports::error::StoreError;
use crate::ports::tasks::Finish;
use crate::store::dynamo::attributes::{Item, number, string};
use crate::store::dynamo::keys;
use crate::store::dynamo::tasks::terminal::{finish_uncounted, is_failure_without_result};
use crate::store::dynamo::tasks::writes::{Over, task_terminal};
use crate::store::dynamo::{DynamoTaskStore, cancellation_codes};
use crate::store::error::cancellation_fault;
use writes::RunStep;

/// The most steps one terminal write tries before it is retried as a conflict.
const MAX_STEPS: usize = 8;

/// The step that the run calls for, as it was when it refused the last one. `None` when the
/// run is gone, keeps no counters, or is running with no task left. A count cannot mend such
/// counters, so the task is finished uncounted, with a warning.
fn next_step(run: Option<&Item>) -> Option<RunStep> {
    let run = run.filter(|run| !run.is_empty())?;
    let left = number::<i64>(run, "tasks_remaining")?;
    let running = string(run, "status") == Some("running");
    match (running, left) {
        (_, 2..) => Some(RunStep::Count),
        (true, 1) => Some(RunStep::CountAndComplete),
        (false, _) => Some(RunStep::CountOnly),
        (true, _) => {
            tracing::warn!(left, "a running run counts no task left");
            None
        }
    }
}

/// How a terminal write's transaction ended.
enum Counted {
    Written,
    /// The task's condition failed: it is terminal already. `failed_without_result` says
    /// whether it failed without a result.
    TaskRefused {
        failed_without_result: bool,
    },
    /// The run's condition failed: `run` is the run item as it was.
    RunRefused {
        run: Option<Item>,
    },
}

/// A cancelled terminal write: the task refused it (terminal already), the run refused it
/// (try the next step), or a fault (a conflict, an item too large).
fn counted_refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
) -> Result<Counted, StoreError> {
    if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    {
        let reasons = cancelled.cancellation_reasons();
        let codes = cancellation_codes(reasons);
        if let Some(fault) = cancellation_fault(&codes) {
            return Err(StoreError::failed("TransactWriteItems(finish)", fault, err));
        }
        match codes.as_slice() {
            ["ConditionalCheckFailed", ..] => {
                let old = reasons.first().and_then(|r| r.item());
                let failed_without_result = old.is_some_and(is_failure_without_result);
                return Ok(Counted::TaskRefused {
                    failed_without_result,
                });
            }
            [_, "ConditionalCheckFailed"] => {
                let run = reasons.get(1).and_then(|r| r.item()).cloned();
                return Ok(Counted::RunRefused { run });
            }
            _ => {}
        }
    }
    Err(StoreError::from_sdk("TransactWriteItems(finish)", err))
}

pub(crate) mod writes;

/// The terminal write, counted on the run item. While more than one task remains, it
/// only counts. For the last task, it counts and completes the run. For a run that is
/// not running, it counts without completing. If a step is refused, the next step is the
/// one that the run, as it was then, calls for. An operator's re-queue and other tasks'
/// counts change the run meanwhile. `None` when the run is gone or keeps no counters.
pub(crate) async fn finish_on_run(
    store: &DynamoTaskStore,
    task: &TaskRef,
    (terminal, spend): (&Terminal, DeliverySpend<'_>),
    now: &str,
) -> Result<Option<Finish>, StoreError> {
    let mut step = RunStep::Count;
    for _ in 0..MAX_STEPS {
        match finish_counted(store, task, (terminal, spend), now, step).await? {
            Counted::Written => {
                let completed_run = step == RunStep::CountAndComplete;
                if completed_run {
                    tracing::info!("the run is complete");
                }
                let spend_counted = true;
                return Ok(Some(Finish::Written {
                    completed_run,
                    spend_counted,
                }));
            }
            Counted::TaskRefused {
                failed_without_result: true,
            } if terminal.status() == TaskStatus::Successful => {
                return replace_failure(store, task, (terminal, spend), now)
                    .await
                    .map(Some);
            }
            Counted::TaskRefused { .. } => return Ok(Some(Finish::LostRace)),
            Counted::RunRefused { run } => match next_step(run.as_ref()) {
                Some(next) => step = next,
                None => return Ok(None),
            },
        }
    }
    Err(StoreError::Changed {
        detail: format!("the counters of run {} kept changing", task.run_id),
    })
}

async fn finish_counted(
    store: &DynamoTaskStore,
    task: &TaskRef,
    (terminal, spend): (&Terminal, DeliverySpend<'_>),
    now: &str,
    step: RunStep,
) -> Result<Counted, StoreError> {
    let over = match step {
        RunStep::Recount => Over::FailureWithoutResult,
        _ => Over::Open,
    };
    let task_update = task_terminal(terminal, now, over)
        .with_spend_by(spend)
        .into_update(&store.table, keys::task_key(task));
    let run_update = writes::run_count(step, terminal, now)
        .with_spend(spend.spend)
        .with_not_modified(terminal)
        .into_update(&store.table, keys::run_key(&task.job_id, &task.run_id));
    let result = store
        .client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().update(task_update).build())
        .transact_items(TransactWriteItem::builder().update(run_update).build())
        .send()
        .await;
    match result {
        Ok(_) => Ok(Counted::Written),
        Err(err) => counted_refusal(err),
    }
}

/// A success in place of a failure without a result. It is counted again in the same
/// transaction, or written alone when the run keeps no counters.
async fn replace_failure(
    store: &DynamoTaskStore,
    task: &TaskRef,
    (terminal, spend): (&Terminal, DeliverySpend<'_>),
    now: &str,
) -> Result<Finish, StoreError> {
    let recounted = finish_counted(store, task, (terminal, spend), now, RunStep::Recount);
    let replaced = match recounted.await? {
        Counted::Written => Finish::Written {
            completed_run: false,
            spend_counted: true,
        },
        Counted::TaskRefused { .. } => Finish::LostRace,
        Counted::RunRefused { .. } => {
            let over = Over::FailureWithoutResult;
            finish_uncounted(store, task, terminal, now, over).await?
        }
    };
    if replaced != Finish::LostRace {
        tracing::info!("a stored result replaced a failure written first");
    }
    Ok(replaced)
}
