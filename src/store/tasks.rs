//! The task store: reading tasks, jobs and runs, and the two conditional writes, in DynamoDB.

use std::collections::HashMap;
use std::future::Future;
use std::time::SystemTime;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, KeysAndAttributes, ReturnValue,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use crate::domain::ids::TaskRef;
use crate::domain::model::{Parents, Task, TaskStatus, Terminal};
use crate::domain::time::{epoch_millis, rfc3339};
use crate::store::error::{StoreError, cancellation_fault};

/// A claim's lease under `DUPLICATE_POLICY=lease`: who holds the task, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease<'a> {
    pub owner: &'a str,
    pub until: SystemTime,
}

/// The result of trying to move a task to `processing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This delivery may work on the task; `attempts` counts the claims so far, this one included.
    Claimed { attempts: u32, was: TaskStatus },
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
    /// The task is terminal and counted; `completed_run` when it was its run's last task.
    Written { completed_run: bool },
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

    /// Moves a pending or processing task to processing, counting the attempt; with a
    /// lease, only if no other invocation holds a live one, and takes it.
    fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Gives up this delivery's lease, if it still holds it (a delivery that ends without a
    /// terminal write, so the next one need not wait for the lease to expire).
    fn release(
        &self,
        task: &TaskRef,
        owner: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The one terminal write: only a task still pending or processing can take it, except
    /// that a stored result may replace a failure that has none (a success that raced a
    /// failure and lost the write: a stored result always wins).
    fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: SystemTime,
    ) -> impl Future<Output = Result<Finish, StoreError>> + Send;
}

/// [`TaskStore`] on one DynamoDB table with string keys `pk` and `sk`.
#[derive(Debug, Clone)]
pub struct DynamoTaskStore {
    client: Client,
    table: String,
}

/// Only a task in one of these states can be claimed or finished.
const OPEN: &str = "#status IN (:pending, :processing)";

impl DynamoTaskStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    fn task_key(task: &TaskRef) -> HashMap<String, AttributeValue> {
        key(
            keys::tasks_partition(&task.job_id, &task.run_id),
            keys::task_sort(&task.task_id),
        )
    }

    /// The job and the run share the job's partition: (pk, the run's sk).
    fn run_key_parts(task: &TaskRef) -> (String, String) {
        (
            keys::job_partition(&task.job_id),
            keys::run_sort(&task.run_id),
        )
    }
}

/// The table's key scheme, in one place: a run's tasks share a partition; a job and its
/// runs share the job's.
pub mod keys {
    use crate::domain::ids::Id;

    pub fn tasks_partition(job: &Id, run: &Id) -> String {
        format!("RUN#{job}#{run}")
    }

    pub fn task_sort(task: &Id) -> String {
        format!("TASK#{task}")
    }

    /// The job item's sort key, in its own partition.
    pub const JOB_SORT: &str = "JOB";

    pub fn job_partition(job: &Id) -> String {
        format!("JOB#{job}")
    }

    pub fn run_sort(run: &Id) -> String {
        format!("RUN#{run}")
    }
}

impl TaskStore for DynamoTaskStore {
    #[tracing::instrument(skip_all)]
    async fn load_task(&self, task: &TaskRef) -> Result<Option<Task>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::task_key(task)))
            // Strongly consistent: a task written just before its message was sent (or
            // re-queued just now) must never read as missing or terminal, which would ack it.
            .consistent_read(true)
            .projection_expression("#status, #url")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#url", "url")
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetItem", e))?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        Ok(Some(Task {
            status: status_of(&item)?,
            url: string(&item, "url").map(str::to_owned),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn load_parents(&self, task: &TaskRef) -> Result<Parents, StoreError> {
        let (pk, run_sk) = Self::run_key_parts(task);
        let keys = KeysAndAttributes::builder()
            .keys(key(pk.clone(), keys::JOB_SORT.into()))
            .keys(key(pk, run_sk.clone()))
            .projection_expression("sk, #status")
            .expression_attribute_names("#status", "status")
            .consistent_read(true)
            .build()
            .expect("keys, the one required field, are set");
        let out = self
            .client
            .batch_get_item()
            .request_items(&self.table, keys)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("BatchGetItem", e))?;
        if out.unprocessed_keys.as_ref().is_some_and(|u| !u.is_empty()) {
            return Err(StoreError::Aws {
                operation: "BatchGetItem",
                fault: crate::store::error::AwsFault::Throttled,
                source: "DynamoDB left keys unprocessed".into(),
            });
        }
        let mut parents = Parents::default();
        for item in out
            .responses
            .unwrap_or_default()
            .remove(&self.table)
            .unwrap_or_default()
        {
            let status = string(&item, "status").map(str::to_owned);
            match string(&item, "sk") {
                Some(keys::JOB_SORT) => parents.job_status = status,
                Some(sk) if sk == run_sk => parents.run_status = status,
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
    ) -> Result<Claim, StoreError> {
        const CLAIM: &str = "SET #status = :processing, updated_at = :now";
        let expression = match lease {
            None => Expression::new(format!("{CLAIM} ADD attempts :one"), OPEN),
            Some(lease) => Expression::new(
                format!("{CLAIM}, lease_owner = :owner, lease_until = :until ADD attempts :one"),
                "#status IN (:pending, :processing) AND (attribute_not_exists(lease_until) \
                 OR lease_until < :now_ms OR lease_owner = :owner)",
            )
            .value(":owner", s(lease.owner))
            .value(":until", n(epoch_millis(lease.until)))
            .value(":now_ms", n(epoch_millis(now))),
        }
        .name("#status", "status")
        .value(":pending", s(TaskStatus::Pending.as_str()))
        .value(":processing", s(TaskStatus::Processing.as_str()))
        .value(":now", s(&rfc3339(now)))
        .value(":one", n(1));
        let result = expression
            .apply_to_update_item(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(Self::task_key(task)))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let old = out.attributes.unwrap_or_default();
                let attempts = number(&old, "attempts").unwrap_or(0) + 1;
                Ok(Claim::Claimed {
                    attempts,
                    was: status_of(&old)?,
                })
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => {
                    let Some(item) = e.item().filter(|item| !item.is_empty()) else {
                        return Ok(Claim::Missing);
                    };
                    if status_of(item)?.is_terminal() {
                        return Ok(Claim::AlreadyTerminal);
                    }
                    let until = number::<u64>(item, "lease_until").unwrap_or_default();
                    Ok(Claim::Leased {
                        until: SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(until),
                    })
                }
                _ => Err(StoreError::from_sdk("UpdateItem(claim)", err)),
            },
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
        now: SystemTime,
    ) -> Result<Finish, StoreError> {
        let now = rfc3339(now);
        for step in [
            RunStep::Count,
            RunStep::CountAndComplete,
            RunStep::CountOnly,
        ] {
            match self.finish_counted(task, terminal, &now, step).await? {
                Counted::Written => {
                    let completed_run = step == RunStep::CountAndComplete;
                    if completed_run {
                        tracing::info!("the run is complete");
                    }
                    return Ok(Finish::Written { completed_run });
                }
                Counted::TaskRefused {
                    failed_without_result,
                } if failed_without_result && terminal.status() == TaskStatus::Successful => {
                    return self.replace_failure(task, terminal, &now).await;
                }
                Counted::TaskRefused { .. } => return Ok(Finish::LostRace),
                Counted::RunRefused => continue,
            }
        }
        tracing::warn!("the run is gone or has no counters: the task is finished uncounted");
        self.finish_uncounted(task, terminal, &now, Over::Open)
            .await
    }

    #[tracing::instrument(skip_all)]
    async fn release(&self, task: &TaskRef, owner: &str) -> Result<(), StoreError> {
        let result = Expression::new(
            "REMOVE lease_owner, lease_until".into(),
            "lease_owner = :owner",
        )
        .value(":owner", s(owner))
        .apply_to_update_item(self.client.update_item())
        .table_name(&self.table)
        .set_key(Some(Self::task_key(task)))
        .send()
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(release)", err)),
        }
    }
}

/// How the terminal write's transaction treats the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunStep {
    /// More than one task remains: count this one.
    Count,
    /// This is the last task of a running run: count it and complete the run.
    CountAndComplete,
    /// The run is not running (or its counters are off): count it, complete nothing.
    CountOnly,
    /// A success replaces a failure already counted: move one count from failed to
    /// succeeded; the run's remaining count and status stay.
    Recount,
}

/// Which task states a terminal write may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Pending or processing: the one terminal write.
    Open,
    /// Failed without a stored result: a success that lost the race to a failure.
    FailureWithoutResult,
}

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
        terminal: &Terminal,
        now: &str,
        step: RunStep,
    ) -> Result<Counted, StoreError> {
        let over = match step {
            RunStep::Recount => Over::FailureWithoutResult,
            _ => Over::Open,
        };
        let task_update =
            task_terminal(terminal, now, over).into_update(&self.table, Self::task_key(task));
        let (pk, sk) = Self::run_key_parts(task);
        let run_update = run_count(step, terminal, now).into_update(&self.table, key(pk, sk));
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(task_update).build())
            .transact_items(TransactWriteItem::builder().update(run_update).build())
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Counted::Written),
            Err(err) => err,
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            err.as_service_error()
        {
            let reasons = cancelled.cancellation_reasons();
            let codes = cancellation_codes(reasons);
            if let Some(fault) = cancellation_fault(&codes) {
                return Err(StoreError::aws("TransactWriteItems(finish)", fault, err));
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
        Err(StoreError::from_sdk("TransactWriteItems(finish)", err))
    }

    /// A success in place of a failure without a result: counted over in the same
    /// transaction, or alone when the run keeps no counters.
    async fn replace_failure(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: &str,
    ) -> Result<Finish, StoreError> {
        let replaced = match self
            .finish_counted(task, terminal, now, RunStep::Recount)
            .await?
        {
            Counted::Written => Finish::Written {
                completed_run: false,
            },
            Counted::TaskRefused { .. } => Finish::LostRace,
            Counted::RunRefused => {
                self.finish_uncounted(task, terminal, now, Over::FailureWithoutResult)
                    .await?
            }
        };
        if replaced != Finish::LostRace {
            tracing::info!("a stored result replaced a failure written first");
        }
        Ok(replaced)
    }

    /// The terminal write alone, for a task whose run keeps no counters.
    async fn finish_uncounted(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: &str,
        over: Over,
    ) -> Result<Finish, StoreError> {
        let result = task_terminal(terminal, now, over)
            .apply_to_update_item(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(Self::task_key(task)))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Finish::Written {
                completed_run: false,
            }),
            Err(err) if is_condition_failure(&err) => Ok(Finish::LostRace),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(finish)", err)),
        }
    }
}

fn is_condition_failure<R>(err: &SdkError<UpdateItemError, R>) -> bool {
    err.as_service_error()
        .is_some_and(|e| e.is_conditional_check_failed_exception())
}

/// The cancellation reason codes of a transaction's items, in item order (`None` for an item
/// that was fine).
pub(crate) fn cancellation_codes(reasons: &[CancellationReason]) -> Vec<&str> {
    reasons.iter().map(|r| r.code().unwrap_or("None")).collect()
}

/// A task item that is `failed` and names no stored result.
fn is_failure_without_result(item: &HashMap<String, AttributeValue>) -> bool {
    string(item, "status") == Some(TaskStatus::Failed.as_str()) && !item.contains_key("result_key")
}

/// An update expression with exactly the names and values it uses (DynamoDB refuses unused
/// ones).
pub(crate) struct Expression {
    update: String,
    condition: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expression {
    pub(crate) fn new(update: String, condition: &str) -> Self {
        Self {
            update,
            condition: condition.to_owned(),
            names: HashMap::new(),
            values: HashMap::new(),
        }
    }

    pub(crate) fn name(mut self, placeholder: &str, name: &str) -> Self {
        self.names.insert(placeholder.into(), name.into());
        self
    }

    pub(crate) fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.into(), value);
        self
    }

    pub(crate) fn into_update(self, table: &str, key: HashMap<String, AttributeValue>) -> Update {
        Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(self.update)
            .condition_expression(self.condition)
            .set_expression_attribute_names(non_empty(self.names))
            .set_expression_attribute_values(non_empty(self.values))
            // What the item was when the condition failed: a success tells a failure it
            // may replace from one it may not.
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("table, key and update expression, the required fields, are set")
    }

    fn apply_to_update_item(self, request: UpdateItemFluentBuilder) -> UpdateItemFluentBuilder {
        request
            .update_expression(self.update)
            .condition_expression(self.condition)
            .set_expression_attribute_names(non_empty(self.names))
            .set_expression_attribute_values(non_empty(self.values))
    }
}

/// DynamoDB refuses an empty map of expression names or values.
fn non_empty<V>(map: HashMap<String, V>) -> Option<HashMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

/// The task's terminal write, conditional on the task being in a state it may replace.
/// Empty optional values (a minimal record) are removed rather than written.
fn task_terminal(terminal: &Terminal, now: &str, over: Over) -> Expression {
    let mut set = vec![
        "#status = :status",
        "updated_at = :now",
        "finished_at = :now",
    ];
    let mut remove = vec!["lease_owner", "lease_until"];
    let mut values = vec![(":status", s(terminal.status().as_str())), (":now", s(now))];
    match terminal {
        Terminal::Succeeded(r) => {
            set.extend(["result_key = :key", "result_sha256 = :sha"]);
            set.extend(["result_size = :size", "http_status = :http"]);
            values.extend([(":key", s(r.key.as_str())), (":sha", s(&r.sha256))]);
            values.extend([(":size", n(r.size)), (":http", n(r.http_status))]);
            for (set_it, name, placeholder, value) in [
                (
                    "content_type = :ctype",
                    "content_type",
                    ":ctype",
                    r.content_type.as_str(),
                ),
                (
                    "final_url = :final",
                    "final_url",
                    ":final",
                    r.final_url.as_str(),
                ),
            ] {
                if value.is_empty() {
                    remove.push(name);
                } else {
                    set.push(set_it);
                    values.push((placeholder, s(value)));
                }
            }
            remove.push("#error");
        }
        Terminal::Failed(f) => {
            set.push("#error = :error");
            values.push((":error", s(&f.reason)));
            match f.http_status {
                Some(http) => {
                    set.push("http_status = :http");
                    values.push((":http", n(http)));
                }
                None => remove.push("http_status"),
            }
        }
    }
    let update = format!("SET {} REMOVE {}", set.join(", "), remove.join(", "));
    let expression = match over {
        Over::Open => Expression::new(update, OPEN)
            .value(":pending", s(TaskStatus::Pending.as_str()))
            .value(":processing", s(TaskStatus::Processing.as_str())),
        Over::FailureWithoutResult => Expression::new(
            update,
            "#status = :failed AND attribute_not_exists(result_key)",
        )
        .value(":failed", s(TaskStatus::Failed.as_str())),
    };
    values
        .into_iter()
        .fold(expression, |e, (placeholder, value)| {
            e.value(placeholder, value)
        })
        .name("#status", "status")
        .name("#error", "error")
}

/// The run's side of the terminal write.
fn run_count(step: RunStep, terminal: &Terminal, now: &str) -> Expression {
    let counter = match terminal {
        Terminal::Succeeded(_) => "tasks_succeeded",
        Terminal::Failed(_) => "tasks_failed",
    };
    let add = format!("ADD tasks_remaining :minus_one, {counter} :one");
    let count = format!("{add} SET updated_at = :now");
    let expression = match step {
        RunStep::Count => Expression::new(count, "tasks_remaining > :one"),
        RunStep::CountAndComplete => Expression::new(
            // `times_completed` lets anyone check that the run completed exactly once.
            format!(
                "{add}, times_completed :one \
                 SET updated_at = :now, #status = :completed, completed_at = :now"
            ),
            "tasks_remaining = :one AND #status = :running",
        )
        .name("#status", "status")
        .value(":completed", s("completed"))
        .value(":running", s("running")),
        RunStep::CountOnly => Expression::new(count, "attribute_exists(tasks_remaining)"),
        RunStep::Recount => Expression::new(
            "ADD tasks_failed :minus_one, tasks_succeeded :one SET updated_at = :now".into(),
            "attribute_exists(tasks_remaining)",
        ),
    };
    expression
        .value(":minus_one", n(-1))
        .value(":one", n(1))
        .value(":now", s(now))
}

pub(crate) fn key(pk: String, sk: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pk)),
        ("sk".to_owned(), AttributeValue::S(sk)),
    ])
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn string<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

fn number<T: std::str::FromStr>(item: &HashMap<String, AttributeValue>, name: &str) -> Option<T> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

fn status_of(item: &HashMap<String, AttributeValue>) -> Result<TaskStatus, StoreError> {
    let raw = string(item, "status");
    raw.and_then(TaskStatus::parse)
        .ok_or_else(|| StoreError::Corrupt {
            what: "task",
            detail: format!("status {raw:?} is not one of pending, processing, successful, failed"),
        })
}
