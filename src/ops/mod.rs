//! Operators' routines that would take more than one aws CLI command: a run's progress and
//! failures, re-queueing a run's failed tasks, replaying the poison quarantine.

pub mod local_mapping;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use tokio::time::Instant;

use crate::domain::ids::{Id, TaskRef};
use crate::domain::message;
use crate::domain::time::rfc3339;
use crate::retry::{Patience, RetryPolicy};
use crate::store::error::{StoreError, cancellation_fault};
use crate::store::tasks::{Expression, cancellation_codes, key, keys};

/// The clients and names the routines work on.
pub struct Ops {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub table: String,
}

/// A run as stored, and its tasks by status.
#[derive(Debug, Default)]
pub struct RunProgress {
    /// The run item's attributes that tell its progress (status, counters, times).
    pub run: BTreeMap<String, String>,
    /// Tasks counted by status, from the tasks themselves.
    pub by_status: BTreeMap<String, u64>,
    /// Failed tasks: (task id, error).
    pub failures: Vec<(String, String)>,
}

/// What a re-queue did.
#[derive(Debug, Default)]
pub struct Requeued {
    /// Failed tasks set back to pending, with the run's counters.
    pub reset: Vec<String>,
    /// Task ids sent to the queue.
    pub sent: Vec<String>,
    /// Task ids whose message could not be sent: re-run with `resend_pending`.
    pub unsent: Vec<String>,
    /// Failed tasks left failed because concurrent writes kept conflicting with the reset:
    /// re-run to re-queue them.
    pub conflicted: Vec<String>,
}

/// How long, and how often, one task's reset is tried again while it conflicts with
/// concurrent writes: an operator can wait longer than an invocation.
const RESET_PATIENCE: Duration = Duration::from_secs(20);
const RESET_RETRIES: RetryPolicy = RetryPolicy {
    attempts: 12,
    base: Duration::from_millis(50),
    max_pause: Duration::from_secs(2),
};

/// What a replay did, by quarantine key.
#[derive(Debug, Default)]
pub struct Replayed {
    pub sent: Vec<String>,
    pub deleted: Vec<String>,
    /// Objects that could not be replayed, and why.
    pub skipped: Vec<(String, String)>,
}

const RUN_FIELDS: [&str; 9] = [
    "status",
    "tasks_total",
    "tasks_remaining",
    "tasks_succeeded",
    "tasks_failed",
    "times_completed",
    "created_at",
    "updated_at",
    "completed_at",
];

impl Ops {
    /// The run item and every task of the run (one Query, paged).
    pub async fn progress(&self, job: &Id, run: &Id) -> Result<RunProgress, StoreError> {
        let mut progress = RunProgress {
            run: self.run_fields(job, run).await?,
            ..RunProgress::default()
        };
        for (task, fields) in self.tasks(job, run).await? {
            let status = fields.get("status").and_then(text).unwrap_or_default();
            if status == "failed" {
                let error = fields.get("error").and_then(text).unwrap_or_default();
                progress.failures.push((task, error));
            }
            *progress.by_status.entry(status).or_default() += 1;
        }
        Ok(progress)
    }

    /// The run item's attributes that tell its progress.
    async fn run_fields(&self, job: &Id, run: &Id) -> Result<BTreeMap<String, String>, StoreError> {
        let item = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(keys::job_partition(job), keys::run_sort(run))))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetItem(run)", e))?
            .item
            .ok_or_else(|| StoreError::Corrupt {
                what: "run",
                detail: format!("{job}/{run} does not exist"),
            })?;
        Ok(RUN_FIELDS
            .iter()
            .filter_map(|f| Some((f.to_string(), text(item.get(*f)?)?)))
            .collect())
    }

    /// Sets the run's failed tasks back to pending (each with the run's counters, in one
    /// transaction, so a task is never counted twice) and sends one message per task. With
    /// `resend_pending`, tasks already pending are sent again too (a duplicate is harmless:
    /// the worker converges). A cancelled run is left alone.
    pub async fn requeue_failed(
        &self,
        job: &Id,
        run: &Id,
        queue_url: &str,
        resend_pending: bool,
    ) -> Result<Requeued, StoreError> {
        let fields = self.run_fields(job, run).await?;
        if fields.get("status").map(String::as_str) == Some("cancelled") {
            return Err(StoreError::Refused {
                detail: format!("run {job}/{run} is cancelled"),
            });
        }
        let counted = fields.contains_key("tasks_remaining");
        let mut requeued = Requeued::default();
        let mut to_send = Vec::new();
        let conflicts = AtomicU64::new(0);
        for (task, fields) in self.tasks(job, run).await? {
            let status = fields.get("status").and_then(text).unwrap_or_default();
            if status == "failed" {
                let task_id = parse_id(&task)?;
                let until = Instant::now() + RESET_PATIENCE;
                let patience = Patience::new(until, RESET_RETRIES, &conflicts);
                match self.reset(job, run, &task_id, counted, &patience).await {
                    Ok(true) => {
                        requeued.reset.push(task.clone());
                        to_send.push(task_id);
                    }
                    Ok(false) => {}
                    Err(err) if err.is_conflict() => requeued.conflicted.push(task.clone()),
                    Err(err) => return Err(err),
                }
            } else if resend_pending && status == "pending" {
                to_send.push(parse_id(&task)?);
            }
        }
        for chunk in to_send.chunks(10) {
            let refs: Vec<TaskRef> = chunk
                .iter()
                .map(|task_id| TaskRef {
                    job_id: job.clone(),
                    run_id: run.clone(),
                    task_id: task_id.clone(),
                })
                .collect();
            let (sent, unsent) = self.send(queue_url, &refs).await;
            requeued.sent.extend(sent);
            requeued.unsent.extend(unsent);
        }
        Ok(requeued)
    }

    /// Sends each quarantined message's body back to the queue (after the producer or the
    /// worker has been fixed); with `delete`, removes each object once its body is sent.
    pub async fn replay_quarantine(
        &self,
        bucket: &str,
        prefix: &str,
        queue_url: &str,
        delete: bool,
    ) -> Result<Replayed, StoreError> {
        let mut replayed = Replayed::default();
        let mut pages = self
            .s3
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| StoreError::from_sdk("ListObjectsV2", e))?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                match self.quarantined_body(bucket, key).await? {
                    Ok(body) => {
                        self.sqs
                            .send_message()
                            .queue_url(queue_url)
                            .message_body(body)
                            .send()
                            .await
                            .map_err(|e| StoreError::from_sdk("SendMessage", e))?;
                        replayed.sent.push(key.to_owned());
                        if delete {
                            self.s3
                                .delete_object()
                                .bucket(bucket)
                                .key(key)
                                .send()
                                .await
                                .map_err(|e| StoreError::from_sdk("DeleteObject", e))?;
                            replayed.deleted.push(key.to_owned());
                        }
                    }
                    Err(why) => replayed.skipped.push((key.to_owned(), why)),
                }
            }
        }
        Ok(replayed)
    }

    /// Every task of the run: (task id, attributes).
    async fn tasks(
        &self,
        job: &Id,
        run: &Id,
    ) -> Result<Vec<(String, HashMap<String, AttributeValue>)>, StoreError> {
        let mut pages = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(keys::tasks_partition(job, run)))
            .consistent_read(true)
            .into_paginator()
            .items()
            .send();
        let mut tasks = Vec::new();
        while let Some(item) = pages.next().await {
            let item = item.map_err(|e| StoreError::from_sdk("Query(tasks)", e))?;
            let sort = item.get("sk").and_then(text).unwrap_or_default();
            let task = sort.strip_prefix("TASK#").unwrap_or(&sort).to_owned();
            tasks.push((task, item));
        }
        Ok(tasks)
    }

    /// One failed task back to pending, and (if the run is counted) back into the run's
    /// remaining count, which reopens a completed run; tried again while a concurrent
    /// transaction holds the task or the run. False if the task was not failed any more when
    /// the write landed.
    async fn reset(
        &self,
        job: &Id,
        run: &Id,
        task: &Id,
        counted: bool,
        patience: &Patience<'_>,
    ) -> Result<bool, StoreError> {
        let items = reset_items(&self.table, job, run, task, counted);
        patience
            .retry(|| async {
                let result = self
                    .dynamodb
                    .transact_write_items()
                    .set_transact_items(Some(items.clone()))
                    .send()
                    .await;
                reset_result(result, job, run)
            })
            .await
    }

    /// Sends one message per task (at most 10): (sent, unsent) task ids.
    async fn send(&self, queue_url: &str, tasks: &[TaskRef]) -> (Vec<String>, Vec<String>) {
        let ids: Vec<String> = tasks.iter().map(|t| t.task_id.to_string()).collect();
        let entries: Result<Vec<_>, _> = tasks
            .iter()
            .enumerate()
            .map(|(i, task)| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(message::body(task))
                    .build()
            })
            .collect();
        let sent = match entries {
            Ok(entries) => {
                self.sqs
                    .send_message_batch()
                    .queue_url(queue_url)
                    .set_entries(Some(entries))
                    .send()
                    .await
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not build the messages");
                return (Vec::new(), ids);
            }
        };
        match sent {
            Ok(out) => {
                let failed: HashSet<&str> = out.failed().iter().map(|f| f.id()).collect();
                let (mut sent, mut unsent) = (Vec::new(), Vec::new());
                for (i, id) in ids.into_iter().enumerate() {
                    if failed.contains(i.to_string().as_str()) {
                        unsent.push(id);
                    } else {
                        sent.push(id);
                    }
                }
                (sent, unsent)
            }
            Err(err) => {
                let err = StoreError::from_sdk("SendMessageBatch", err);
                tracing::warn!(error = %err, "could not send the messages");
                (Vec::new(), ids)
            }
        }
    }

    /// The original body of a quarantined message, or why it cannot be replayed.
    async fn quarantined_body(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Result<String, String>, StoreError> {
        let object = self
            .s3
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetObject(quarantine)", e))?;
        let bytes = object
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Corrupt {
                what: "quarantined object",
                detail: e.to_string(),
            })?
            .into_bytes();
        let document: serde_json::Value = match serde_json::from_slice(&bytes) {
            Ok(document) => document,
            Err(e) => return Ok(Err(format!("not a quarantine document: {e}"))),
        };
        Ok(match document["record"]["body"].as_str() {
            Some(body) => Ok(body.to_owned()),
            None => Err("the quarantined message had no body".into()),
        })
    }
}

/// The reset's writes: the task back to pending (lease and failure cleared) and, for a
/// counted run, the task back into the run's remaining count.
fn reset_items(
    table: &str,
    job: &Id,
    run: &Id,
    task: &Id,
    counted: bool,
) -> Vec<TransactWriteItem> {
    let now = AttributeValue::S(rfc3339(std::time::SystemTime::now()));
    let task_update = Expression::new(
        "SET #status = :pending, updated_at = :now, requeued_at = :now \
         REMOVE #error, http_status, finished_at, lease_owner, lease_until"
            .into(),
        "#status = :failed",
    )
    .name("#status", "status")
    .name("#error", "error")
    .value(":pending", AttributeValue::S("pending".into()))
    .value(":failed", AttributeValue::S("failed".into()))
    .value(":now", now.clone())
    .into_update(
        table,
        key(keys::tasks_partition(job, run), keys::task_sort(task)),
    );
    let mut items = vec![TransactWriteItem::builder().update(task_update).build()];
    if counted {
        let run_update = Expression::new(
            "ADD tasks_failed :minus_one, tasks_remaining :one \
             SET #status = :running, updated_at = :now REMOVE completed_at"
                .into(),
            "attribute_exists(tasks_remaining) AND #status <> :cancelled",
        )
        .name("#status", "status")
        .value(":minus_one", AttributeValue::N("-1".into()))
        .value(":one", AttributeValue::N("1".into()))
        .value(":running", AttributeValue::S("running".into()))
        .value(":cancelled", AttributeValue::S("cancelled".into()))
        .value(":now", now)
        .into_update(table, key(keys::job_partition(job), keys::run_sort(run)));
        items.push(TransactWriteItem::builder().update(run_update).build());
    }
    items
}

/// A reset's answer: written, the task no longer failed, a conflict to try again, the run
/// cancelled meanwhile, or an AWS error.
fn reset_result<R>(
    result: Result<R, SdkError<TransactWriteItemsError, HttpResponse>>,
    job: &Id,
    run: &Id,
) -> Result<bool, StoreError> {
    let err = match result {
        Ok(_) => return Ok(true),
        Err(err) => err,
    };
    if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    {
        let codes = cancellation_codes(cancelled.cancellation_reasons());
        if let Some(fault) = cancellation_fault(&codes) {
            return Err(StoreError::aws("TransactWriteItems(requeue)", fault, err));
        }
        match codes.as_slice() {
            ["ConditionalCheckFailed", ..] => return Ok(false),
            [_, "ConditionalCheckFailed"] => {
                return Err(StoreError::Refused {
                    detail: format!("run {job}/{run} was cancelled or lost its counters"),
                });
            }
            _ => {}
        }
    }
    Err(StoreError::from_sdk("TransactWriteItems(requeue)", err))
}

fn text(value: &AttributeValue) -> Option<String> {
    match value {
        AttributeValue::S(s) | AttributeValue::N(s) => Some(s.clone()),
        _ => None,
    }
}

fn parse_id(raw: &str) -> Result<Id, StoreError> {
    Id::parse(raw).map_err(|e| StoreError::Corrupt {
        what: "task id",
        detail: format!("{raw:?}: {e}"),
    })
}
