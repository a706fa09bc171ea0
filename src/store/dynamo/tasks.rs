//! The task store: the port the worker reads tasks, jobs and runs through and makes its
//! conditional writes (claim, release, the terminal write with its run's count), and its
//! DynamoDB adapter. The expressions are in [`crate::store::dynamo::expressions`].

use std::future::Future;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{
    CancellationReason, KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem,
};

use crate::domain::ids::{Id, TaskRef};
use crate::domain::limits::{JobPoliteness, MAX_SLOTS};
use crate::domain::model::{Counting, Parents, Task, TaskStatus, Terminal};
use crate::domain::spend::Spend;
use crate::domain::time::rfc3339;
use crate::store::dynamo::attributes::{Item, number, string};
use crate::store::dynamo::expressions::{self, Expression, Over, RunStep};
use crate::store::dynamo::keys;
use crate::store::error::{AwsError, AwsFault, cancellation_fault};

pub use crate::domain::model::Lease;

/// The result of trying to move a task to `processing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This delivery may work on the task; `attempts` counts the claims so far, this one
    /// included; `url` is the task's.
    Claimed {
        attempts: u32,
        was: TaskStatus,
        url: Option<String>,
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
    ) -> impl Future<Output = Result<Option<Task>, AwsError>> + Send;

    /// The statuses of the task's job and run.
    fn load_parents(
        &self,
        task: &TaskRef,
    ) -> impl Future<Output = Result<Parents, AwsError>> + Send;

    /// Moves a pending or processing task to processing, counting the attempt; with a
    /// lease, only if no other invocation holds a live one, and takes it.
    fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
    ) -> impl Future<Output = Result<Claim, AwsError>> + Send;

    /// Gives up this delivery's lease, if it still holds it (a delivery that ends without a
    /// terminal write, so the next one need not wait for the lease to expire).
    fn release(
        &self,
        task: &TaskRef,
        owner: &str,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// Gives back the attempt a claim counted, and the status it found (`was`), when no
    /// fetch followed it (the host pushed back meanwhile, no time was left): only while the
    /// task is still processing.
    fn unclaim(
        &self,
        task: &TaskRef,
        was: TaskStatus,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// The one terminal write: only a task still pending or processing can take it, except
    /// that a stored result may replace a failure that has none (a success that raced a
    /// failure and lost the write: a stored result always wins). The delivery's `spend` is
    /// added to the counter the task counts in, in the same write, when there is one.
    fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        counter: (Counting, &Spend),
        now: SystemTime,
    ) -> impl Future<Output = Result<Finish, AwsError>> + Send;
}

/// [`TaskStore`] on one DynamoDB table with string keys `pk` and `sk`.
#[derive(Debug, Clone)]
pub struct DynamoTaskStore {
    pub(crate) client: Client,
    pub(crate) table: String,
}

impl DynamoTaskStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// An `UpdateItem` of the run item under this expression.
    pub(crate) fn update_run(
        &self,
        (job, run): (&Id, &Id),
        expression: Expression,
    ) -> UpdateItemFluentBuilder {
        expression
            .apply_to(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(keys::run_key(job, run)))
    }

    /// An `UpdateItem` of the task under this expression.
    fn update_task(&self, task: &TaskRef, expression: Expression) -> UpdateItemFluentBuilder {
        expression
            .apply_to(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(keys::task_key(task)))
    }
}

impl TaskStore for DynamoTaskStore {
    #[tracing::instrument(skip_all)]
    async fn load_task(&self, task: &TaskRef) -> Result<Option<Task>, AwsError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::task_key(task)))
            // Strongly consistent: a task written just before its message was sent (or
            // re-queued just now) must never read as missing or terminal, which would ack it.
            .consistent_read(true)
            .projection_expression("#status, #url")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#url", "url")
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("GetItem", e))?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        Ok(Some(Task {
            status: status_of(&item)?,
            url: string(&item, "url").map(str::to_owned),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn load_parents(&self, task: &TaskRef) -> Result<Parents, AwsError> {
        let run_sort = keys::run_sort(&task.run_id);
        let asked = KeysAndAttributes::builder()
            .keys(keys::job_key(&task.job_id))
            .keys(keys::run_key(&task.job_id, &task.run_id))
            .projection_expression(
                "sk, #status, counter_shards, counter_groups, paid_tier_budget_bytes, \
                 host_max_rps, host_max_inflight, obey_robots",
            )
            .expression_attribute_names("#status", "status")
            .consistent_read(true)
            .build()
            .expect("keys, the one required field, are set");
        let out = self
            .client
            .batch_get_item()
            .request_items(&self.table, asked)
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("BatchGetItem", e))?;
        if out.unprocessed_keys.as_ref().is_some_and(|u| !u.is_empty()) {
            let unprocessed = "DynamoDB left keys unprocessed";
            return Err(AwsError::aws(
                "BatchGetItem",
                AwsFault::Throttled,
                unprocessed,
            ));
        }
        let mut parents = Parents::default();
        let items = out.responses.unwrap_or_default().remove(&self.table);
        for item in items.unwrap_or_default() {
            let status = string(&item, "status").map(str::to_owned);
            match string(&item, "sk") {
                Some(keys::JOB_SORT) => {
                    parents.job_status = status;
                    parents.politeness = job_politeness(&item);
                }
                Some(sk) if sk == run_sort => {
                    parents.run_status = status;
                    parents.counting = Counting::of(
                        number(&item, "counter_shards"),
                        number(&item, "counter_groups"),
                    );
                    parents.paid_budget = number(&item, "paid_tier_budget_bytes");
                }
                _ => {}
            }
        }
        Ok(parents)
    }

    #[tracing::instrument(skip_all, fields(lease = lease.is_some()))]
    async fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
    ) -> Result<Claim, AwsError> {
        let result = self
            .update_task(task, expressions::claim(now, lease))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let old = out.attributes.unwrap_or_default();
                let attempts = number(&old, "attempts").unwrap_or(0) + 1;
                let was = status_of(&old)?;
                let url = string(&old, "url").map(str::to_owned);
                Ok(Claim::Claimed { attempts, was, url })
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => {
                    claim_refused(e.item())
                }
                _ => Err(AwsError::from_sdk("UpdateItem(claim)", err)),
            },
        }
    }

    #[tracing::instrument(skip_all)]
    async fn unclaim(&self, task: &TaskRef, was: TaskStatus) -> Result<(), AwsError> {
        let result = self
            .update_task(task, expressions::unclaim(was))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(unclaim)", err)),
        }
    }

    async fn release(&self, task: &TaskRef, owner: &str) -> Result<(), AwsError> {
        let result = self
            .update_task(task, expressions::release(owner))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(release)", err)),
        }
    }

    /// Counts the task into its run in the same transaction as the terminal write, so a
    /// task is counted exactly once. While more than one task remains that is one
    /// transaction; the last task's transaction also completes the run (only one can take
    /// `tasks_remaining` from 1 to 0). A run that is not running, or has no counters, is
    /// counted without completing, or not at all. A success that finds the task failed
    /// without a result replaces that failure, moving the run's count along.
    #[tracing::instrument(skip_all, fields(status = terminal.status().as_str()))]
    async fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        (counting, spend): (Counting, &Spend),
        now: SystemTime,
    ) -> Result<Finish, AwsError> {
        let now = rfc3339(now);
        if let Counting::Shards(sharding) = counting {
            return self
                .finish_sharded(task, (terminal, spend), &now, sharding)
                .await;
        }
        let steps = [
            RunStep::Count,
            RunStep::CountAndComplete,
            RunStep::CountOnly,
        ];
        for step in steps {
            match self
                .finish_counted(task, (terminal, spend), &now, step)
                .await?
            {
                Counted::Written => {
                    let completed_run = step == RunStep::CountAndComplete;
                    if completed_run {
                        tracing::info!("the run is complete");
                    }
                    let spend_counted = true;
                    return Ok(Finish::Written {
                        completed_run,
                        spend_counted,
                    });
                }
                Counted::TaskRefused {
                    failed_without_result: true,
                } if terminal.status() == TaskStatus::Successful => {
                    return self.replace_failure(task, (terminal, spend), &now).await;
                }
                Counted::TaskRefused { .. } => return Ok(Finish::LostRace),
                Counted::RunRefused => continue,
            }
        }
        tracing::warn!("the run is gone or has no counters: the task is finished uncounted");
        self.finish_uncounted(task, terminal, &now, Over::Open)
            .await
    }
}

/// A claim's refusal, by the item as it was: gone, terminal, or leased by another delivery.
fn claim_refused(item: Option<&Item>) -> Result<Claim, AwsError> {
    let Some(item) = item.filter(|item| !item.is_empty()) else {
        return Ok(Claim::Missing);
    };
    if status_of(item)?.is_terminal() {
        return Ok(Claim::AlreadyTerminal);
    }
    let until = number::<u64>(item, "lease_until").unwrap_or_default();
    Ok(Claim::Leased {
        until: SystemTime::UNIX_EPOCH + Duration::from_millis(until),
    })
}

/// How a terminal write's transaction ended.
enum Counted {
    Written,
    /// The task's condition failed: it is terminal already (and was it failed without a
    /// result?).
    TaskRefused {
        failed_without_result: bool,
    },
    /// The run's condition failed: try the next step.
    RunRefused,
}

impl DynamoTaskStore {
    async fn finish_counted(
        &self,
        task: &TaskRef,
        (terminal, spend): (&Terminal, &Spend),
        now: &str,
        step: RunStep,
    ) -> Result<Counted, AwsError> {
        let over = match step {
            RunStep::Recount => Over::FailureWithoutResult,
            _ => Over::Open,
        };
        let task_update = expressions::task_terminal(terminal, now, over)
            .into_update(&self.table, keys::task_key(task));
        let run_update = expressions::run_count(step, terminal, now)
            .with_spend(spend)
            .into_update(&self.table, keys::run_key(&task.job_id, &task.run_id));
        let result = self
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

    /// A success in place of a failure without a result: counted over in the same
    /// transaction, or alone when the run keeps no counters.
    async fn replace_failure(
        &self,
        task: &TaskRef,
        (terminal, spend): (&Terminal, &Spend),
        now: &str,
    ) -> Result<Finish, AwsError> {
        let recounted = self.finish_counted(task, (terminal, spend), now, RunStep::Recount);
        let replaced = match recounted.await? {
            Counted::Written => Finish::Written {
                completed_run: false,
                spend_counted: true,
            },
            Counted::TaskRefused { .. } => Finish::LostRace,
            Counted::RunRefused => {
                let over = Over::FailureWithoutResult;
                self.finish_uncounted(task, terminal, now, over).await?
            }
        };
        if replaced != Finish::LostRace {
            tracing::info!("a stored result replaced a failure written first");
        }
        Ok(replaced)
    }

    /// The terminal write alone, for a task whose run keeps no counters.
    pub(crate) async fn finish_uncounted(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: &str,
        over: Over,
    ) -> Result<Finish, AwsError> {
        let write = expressions::task_terminal(terminal, now, over);
        let result = self.update_task(task, write).send().await;
        match result {
            Ok(_) => Ok(Finish::Written {
                completed_run: false,
                spend_counted: false,
            }),
            Err(err) if is_condition_failure(&err) => Ok(Finish::LostRace),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(finish)", err)),
        }
    }
}

/// A cancelled terminal write: the task refused (terminal already), the run refused (try
/// the next step), or a fault (a conflict, an item too large).
fn counted_refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
) -> Result<Counted, AwsError> {
    if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    {
        let reasons = cancelled.cancellation_reasons();
        let codes = cancellation_codes(reasons);
        if let Some(fault) = cancellation_fault(&codes) {
            return Err(AwsError::aws("TransactWriteItems(finish)", fault, err));
        }
        match codes.as_slice() {
            ["ConditionalCheckFailed", ..] => {
                let old = reasons.first().and_then(|r| r.item());
                let failed_without_result = old.is_some_and(is_failure_without_result);
                return Ok(Counted::TaskRefused {
                    failed_without_result,
                });
            }
            [_, "ConditionalCheckFailed"] => return Ok(Counted::RunRefused),
            _ => {}
        }
    }
    Err(AwsError::from_sdk("TransactWriteItems(finish)", err))
}

pub(crate) fn is_condition_failure<R>(err: &SdkError<UpdateItemError, R>) -> bool {
    err.as_service_error()
        .is_some_and(|e| e.is_conditional_check_failed_exception())
}

/// The cancellation reason codes of a transaction's items, in item order (`None` for an item
/// that was fine).
pub(crate) fn cancellation_codes(reasons: &[CancellationReason]) -> Vec<&str> {
    reasons.iter().map(|r| r.code().unwrap_or("None")).collect()
}

/// A job's own politeness, each attribute taken only when it is in range (else the
/// fleet's setting stands, with a warning).
fn job_politeness(job: &Item) -> JobPoliteness {
    let rps = number::<f64>(job, "host_max_rps");
    let inflight = number::<u32>(job, "host_max_inflight");
    let politeness = JobPoliteness {
        max_rps: rps.filter(|r| (0.0..=10_000.0).contains(r)),
        max_inflight: inflight.filter(|n| *n <= MAX_SLOTS),
        obey_robots: job
            .get("obey_robots")
            .and_then(|v| v.as_bool().ok())
            .copied(),
    };
    if politeness.max_rps != rps || politeness.max_inflight != inflight {
        tracing::warn!(
            ?rps,
            ?inflight,
            "a job's host limits are out of range: the fleet's apply"
        );
    }
    politeness
}

/// A task item that is `failed` and names no stored result.
pub(crate) fn is_failure_without_result(item: &Item) -> bool {
    string(item, "status") == Some(TaskStatus::Failed.as_str()) && !item.contains_key("result_key")
}

fn status_of(item: &Item) -> Result<TaskStatus, AwsError> {
    let raw = string(item, "status");
    raw.and_then(TaskStatus::parse)
        .ok_or_else(|| AwsError::Corrupt {
            what: "task",
            detail: format!("status {raw:?} is not one of pending, processing, successful, failed"),
        })
}
