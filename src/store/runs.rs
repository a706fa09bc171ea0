//! What operators and producers read and write of a run, on the task store's table: the run
//! item, the run's tasks, a failed task set back to pending with its run's counters, and the
//! producer's creates (job, run with its counters, tasks) and submit cursor.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, TransactWriteItem};

use crate::domain::ids::{Id, TaskRef};
use crate::domain::time::rfc3339;
use crate::store::attributes::{Item, n, s, string, strings};
use crate::store::error::{AwsError, cancellation_fault};
use crate::store::expressions;
use crate::store::keys;
use crate::store::tasks::{DynamoTaskStore, cancellation_codes, is_condition_failure};

/// How a create ended: written now, or there already (as it is stored).
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    Written,
    Existing(Item),
}

/// How a re-queue of one failed task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Back to pending, and counted back into its run.
    Done,
    /// The task was not failed any more when the write landed.
    NotFailed,
}

impl DynamoTaskStore {
    /// The job, `active`, unless it exists already.
    pub async fn create_job(&self, job: &Id) -> Result<Created, AwsError> {
        let mut item = keys::job_key(job);
        item.extend(strings(&[("status", "active"), ("created_at", &now())]));
        self.create(item, "PutItem(job)").await
    }

    /// The run, `running` with its counters at the start (`total` tasks, all remaining) and
    /// its submit cursor at 0, unless it exists already.
    pub async fn create_run(&self, job: &Id, run: &Id, total: u64) -> Result<Created, AwsError> {
        let mut item = keys::run_key(job, run);
        item.extend(strings(&[("status", "running"), ("created_at", &now())]));
        for (counter, value) in [
            ("tasks_total", total),
            ("tasks_remaining", total),
            ("tasks_succeeded", 0),
            ("tasks_failed", 0),
            ("submitted_through", 0),
        ] {
            item.insert(counter.into(), n(value));
        }
        self.create(item, "PutItem(run)").await
    }

    /// The task, `pending` with its URL, unless it exists already.
    pub async fn create_task(&self, task: &TaskRef, url: &str) -> Result<Created, AwsError> {
        let mut item = keys::task_key(task);
        item.extend(strings(&[("url", url), ("status", "pending")]));
        item.insert("created_at".into(), s(&now()));
        self.create(item, "PutItem(task)").await
    }

    /// Moves the run's submit cursor forward to `through` (never back).
    pub async fn advance_submitted(
        &self,
        job: &Id,
        run: &Id,
        through: u64,
    ) -> Result<(), AwsError> {
        let result = expressions::advance_submitted(through, &now())
            .apply_to(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(keys::run_key(job, run)))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(submitted)", err)),
        }
    }

    /// A conditional put that only creates; the item as stored when it was there already.
    async fn create(&self, item: Item, operation: &'static str) -> Result<Created, AwsError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(expressions::ABSENT)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Created::Written),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(e)) => {
                    Ok(Created::Existing(e.item().cloned().unwrap_or_default()))
                }
                _ => Err(AwsError::from_sdk(operation, err)),
            },
        }
    }

    /// The run item, read consistently; `None` when it does not exist.
    pub async fn run_item(&self, job: &Id, run: &Id) -> Result<Option<Item>, AwsError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::run_key(job, run)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("GetItem(run)", e))?;
        Ok(out.item)
    }

    /// Every task of the run, read consistently: (task id, item).
    pub async fn run_tasks(&self, job: &Id, run: &Id) -> Result<Vec<(String, Item)>, AwsError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(&keys::tasks_partition(job, run)))
            .consistent_read(true)
            .into_paginator()
            .items()
            .send();
        let mut tasks = Vec::new();
        while let Some(item) = pages.next().await {
            let item = item.map_err(|e| AwsError::from_sdk("Query(tasks)", e))?;
            let sort = string(&item, "sk").unwrap_or_default();
            let task = keys::task_of_sort(sort).unwrap_or(sort).to_owned();
            tasks.push((task, item));
        }
        Ok(tasks)
    }

    /// A failed task back to pending, and (if the run is `counted`) back into its run's
    /// remaining count, in one transaction, so a task is never counted twice. A conflict is
    /// an error the caller may try again; a run cancelled meanwhile is refused.
    pub async fn requeue_failed(&self, task: &TaskRef, counted: bool) -> Result<Requeue, AwsError> {
        let now = now();
        let task_update =
            expressions::requeue_task(&now).into_update(&self.table, keys::task_key(task));
        let mut items = vec![TransactWriteItem::builder().update(task_update).build()];
        if counted {
            let run_key = keys::run_key(&task.job_id, &task.run_id);
            let run_update = expressions::requeue_run(&now).into_update(&self.table, run_key);
            items.push(TransactWriteItem::builder().update(run_update).build());
        }
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Requeue::Done),
            Err(err) => requeue_refusal(err, task),
        }
    }
}

/// A cancelled re-queue: the task not failed any more, a conflict to try again, or the run
/// cancelled meanwhile.
fn requeue_refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
    task: &TaskRef,
) -> Result<Requeue, AwsError> {
    if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    {
        let codes = cancellation_codes(cancelled.cancellation_reasons());
        if let Some(fault) = cancellation_fault(&codes) {
            return Err(AwsError::aws("TransactWriteItems(requeue)", fault, err));
        }
        match codes.as_slice() {
            ["ConditionalCheckFailed", ..] => return Ok(Requeue::NotFailed),
            [_, "ConditionalCheckFailed"] => {
                let (job, run) = (&task.job_id, &task.run_id);
                return Err(AwsError::Refused {
                    detail: format!("run {job}/{run} was cancelled or lost its counters"),
                });
            }
            _ => {}
        }
    }
    Err(AwsError::from_sdk("TransactWriteItems(requeue)", err))
}

fn now() -> String {
    rfc3339(std::time::SystemTime::now())
}
