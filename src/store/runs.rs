//! What operators read and change of a run, on the task store's table: the run item, the
//! run's tasks, and a failed task set back to pending with its run's counters.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::domain::ids::{Id, TaskRef};
use crate::domain::time::rfc3339;
use crate::store::attributes::{Item, s, string};
use crate::store::error::{AwsError, cancellation_fault};
use crate::store::expressions;
use crate::store::keys;
use crate::store::tasks::{DynamoTaskStore, cancellation_codes};

/// How a re-queue of one failed task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Back to pending, and counted back into its run.
    Done,
    /// The task was not failed any more when the write landed.
    NotFailed,
}

impl DynamoTaskStore {
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
        let now = rfc3339(std::time::SystemTime::now());
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
