//! The task store: reading tasks, jobs and runs, and the two conditional writes, in DynamoDB.

use std::collections::HashMap;
use std::future::Future;
use std::time::SystemTime;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
};

use crate::error::StoreError;
use crate::ids::TaskRef;
use crate::model::{Parents, Task, TaskStatus, Terminal};

/// The result of trying to move a task to `processing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This delivery may work on the task; `attempts` counts the claims so far, this one included.
    Claimed { attempts: u32, was: TaskStatus },
    /// The task became terminal since the guard read it.
    AlreadyTerminal,
    /// The task item is gone.
    Missing,
}

/// The result of the terminal write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Written,
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

    /// Moves a pending or processing task to processing, counting the attempt.
    fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// The one terminal write: only a task still pending or processing can take it.
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
            format!("RUN#{}#{}", task.job_id, task.run_id),
            format!("TASK#{}", task.task_id),
        )
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
        let pk = format!("JOB#{}", task.job_id);
        let run_sk = format!("RUN#{}", task.run_id);
        let keys = KeysAndAttributes::builder()
            .keys(key(pk.clone(), "JOB".into()))
            .keys(key(pk, run_sk.clone()))
            .projection_expression("sk, #status")
            .expression_attribute_names("#status", "status")
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
                fault: crate::error::AwsFault::Throttled,
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
                Some("JOB") => parents.job_status = status,
                Some(sk) if sk == run_sk => parents.run_status = status,
                _ => {}
            }
        }
        Ok(parents)
    }

    #[tracing::instrument(skip_all)]
    async fn claim(&self, task: &TaskRef, now: SystemTime) -> Result<Claim, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::task_key(task)))
            .update_expression("SET #status = :processing, updated_at = :now ADD attempts :one")
            .condition_expression(OPEN)
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":pending", s(TaskStatus::Pending.as_str()))
            .expression_attribute_values(":processing", s(TaskStatus::Processing.as_str()))
            .expression_attribute_values(":now", s(&rfc3339(now)))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
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
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => Ok(match e.item() {
                    Some(item) if !item.is_empty() => Claim::AlreadyTerminal,
                    _ => Claim::Missing,
                }),
                _ => Err(StoreError::from_sdk("UpdateItem(claim)", err)),
            },
        }
    }

    #[tracing::instrument(skip_all, fields(status = terminal.status().as_str()))]
    async fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        now: SystemTime,
    ) -> Result<Finish, StoreError> {
        let now = rfc3339(now);
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::task_key(task)))
            .condition_expression(OPEN)
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":pending", s(TaskStatus::Pending.as_str()))
            .expression_attribute_values(":processing", s(TaskStatus::Processing.as_str()))
            .expression_attribute_values(":status", s(terminal.status().as_str()))
            .expression_attribute_values(":now", s(&now));
        const COMMON: &str = "SET #status = :status, updated_at = :now, finished_at = :now";
        let request = match terminal {
            Terminal::Succeeded(r) => request
                .update_expression(format!(
                    "{COMMON}, result_key = :key, result_sha256 = :sha, result_size = :size, \
                     http_status = :http, content_type = :ctype, final_url = :final \
                     REMOVE #error"
                ))
                .expression_attribute_names("#error", "error")
                .expression_attribute_values(":key", s(r.key.as_str()))
                .expression_attribute_values(":sha", s(&r.sha256))
                .expression_attribute_values(":size", n(r.size))
                .expression_attribute_values(":http", n(r.http_status))
                .expression_attribute_values(":ctype", s(&r.content_type))
                .expression_attribute_values(":final", s(&r.final_url)),
            Terminal::Failed(f) => {
                let request = request
                    .expression_attribute_names("#error", "error")
                    .expression_attribute_values(":error", s(&f.reason));
                match f.http_status {
                    Some(http) => request
                        .update_expression(format!(
                            "{COMMON}, #error = :error, http_status = :http"
                        ))
                        .expression_attribute_values(":http", n(http)),
                    None => request
                        .update_expression(format!("{COMMON}, #error = :error REMOVE http_status")),
                }
            }
        };
        match request.send().await {
            Ok(_) => Ok(Finish::Written),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(Finish::LostRace)
            }
            Err(err) => Err(StoreError::from_sdk("UpdateItem(finish)", err)),
        }
    }
}

fn key(pk: String, sk: String) -> HashMap<String, AttributeValue> {
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

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Option<u32> {
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

/// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T06:01:27.123Z`.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}
