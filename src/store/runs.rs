//! What operators and producers read and write of a run, on the task store's table: the run
//! item, the run's tasks, a failed task set back to pending with its run's counters, and the
//! producer's creates (job, run with its counters or counter shards, tasks) and submit cursor.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    KeysAndAttributes, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use futures_util::{StreamExt, TryStreamExt, stream};

use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::{Counting, shard_of};
use crate::domain::time::rfc3339;
use crate::store::attributes::{Item, n, number, s, string, strings};
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

/// Counter shards created at once.
const SHARD_PUTS_AT_ONCE: usize = 16;

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

    /// The run, `running`, its submit cursor at 0, unless it exists already; counted on its
    /// own item (`shard_totals` empty: `total` tasks, all remaining) or in counter shards (one
    /// a total: `counter_shards`, and `shards_remaining` the shards with tasks to count).
    pub async fn create_run(
        &self,
        (job, run): (&Id, &Id),
        total: u64,
        shard_totals: &[u64],
    ) -> Result<Created, AwsError> {
        let mut item = keys::run_key(job, run);
        item.extend(strings(&[("status", "running"), ("created_at", &now())]));
        let counters = match shard_totals {
            [] => vec![
                ("tasks_remaining", total),
                ("tasks_succeeded", 0),
                ("tasks_failed", 0),
            ],
            totals => vec![
                ("counter_shards", totals.len() as u64),
                (
                    "shards_remaining",
                    totals.iter().filter(|t| **t > 0).count() as u64,
                ),
            ],
        };
        let always = [("tasks_total", total), ("submitted_through", 0)];
        for (counter, value) in counters.into_iter().chain(always) {
            item.insert(counter.into(), n(value));
        }
        self.create(item, "PutItem(run)").await
    }

    /// The run's counter shards, each with its total of tasks all remaining, unless they
    /// exist already.
    pub async fn create_shards(&self, job: &Id, run: &Id, totals: &[u64]) -> Result<(), AwsError> {
        let creates = totals.iter().enumerate().map(|(shard, total)| {
            let mut item = keys::shard_key(job, run, shard as u32);
            for (counter, value) in [
                ("tasks_total", *total),
                ("tasks_remaining", *total),
                ("tasks_succeeded", 0),
                ("tasks_failed", 0),
            ] {
                item.insert(counter.into(), n(value));
            }
            self.create(item, "PutItem(shard)")
        });
        stream::iter(creates)
            .buffer_unordered(SHARD_PUTS_AT_ONCE)
            .try_for_each(|_| async { Ok(()) })
            .await
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

    /// The run's counter shards `0..shards`, read consistently (missing ones left out).
    pub async fn shard_items(
        &self,
        job: &Id,
        run: &Id,
        shards: u32,
    ) -> Result<Vec<Item>, AwsError> {
        let keys: Vec<Item> = (0..shards).map(|i| keys::shard_key(job, run, i)).collect();
        let mut items = Vec::new();
        for chunk in keys.chunks(100) {
            let mut asked = chunk.to_vec();
            while !asked.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(asked))
                    .consistent_read(true)
                    .build()
                    .expect("keys, the one required field, are set");
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(|e| AwsError::from_sdk("BatchGetItem(shards)", e))?;
                items.extend(
                    out.responses
                        .unwrap_or_default()
                        .remove(&self.table)
                        .unwrap_or_default(),
                );
                asked = out
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(&self.table))
                    .map(|k| k.keys)
                    .unwrap_or_default();
            }
        }
        Ok(items)
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

    /// A failed task back to pending, and (if the run counts its tasks, `counting`) back
    /// into the remaining count of its run or counter shard, in one transaction, so a task
    /// is never counted twice; a shard that had nothing left reopens, and the run with it.
    /// A conflict is an error the caller may try again; a run cancelled meanwhile is refused.
    pub async fn requeue_failed(
        &self,
        task: &TaskRef,
        counting: Option<Counting>,
    ) -> Result<Requeue, AwsError> {
        let now = now();
        let task_update =
            expressions::requeue_task(&now).into_update(&self.table, keys::task_key(task));
        let run_key = keys::run_key(&task.job_id, &task.run_id);
        let Some(Counting::Shards(shards)) = counting else {
            let run =
                counting.map(|_| expressions::requeue_run(&now).into_update(&self.table, run_key));
            return match self
                .transact(task_update, run.into_iter().collect())
                .await?
            {
                Refused::Not => Ok(Requeue::Done),
                Refused::Task => Ok(Requeue::NotFailed),
                Refused::Counter | Refused::Run => Err(run_refused(task)),
            };
        };
        let shard = keys::shard_key(&task.job_id, &task.run_id, shard_of(&task.task_id, shards));
        for reopens in [false, true, false] {
            let mut counters = vec![
                expressions::shard_requeue(&now, reopens).into_update(&self.table, shard.clone()),
            ];
            if reopens {
                counters.push(
                    expressions::shard_reopened(&now).into_update(&self.table, run_key.clone()),
                );
            }
            match self.transact(task_update.clone(), counters).await? {
                Refused::Not => return Ok(Requeue::Done),
                Refused::Task => return Ok(Requeue::NotFailed),
                Refused::Run => return Err(run_refused(task)),
                Refused::Counter => continue, // the shard was not as this try assumed
            }
        }
        Err(AwsError::Conflict {
            detail: format!("the counter shard of {} kept changing", task.task_id),
        })
    }

    /// The task's update with its counters', in one transaction: which condition refused it.
    async fn transact(&self, task: Update, counters: Vec<Update>) -> Result<Refused, AwsError> {
        let items = std::iter::once(task)
            .chain(counters)
            .map(|u| TransactWriteItem::builder().update(u).build());
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items.collect()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Refused::Not),
            Err(err) => requeue_refusal(err),
        }
    }
}

/// Which condition of a re-queue's transaction refused it.
enum Refused {
    Not,
    /// The task was not failed any more.
    Task,
    /// The run's or shard's count was not as assumed.
    Counter,
    /// The run was cancelled (or lost its counters) meanwhile.
    Run,
}

/// A cancelled re-queue: whose condition failed; a conflict is an error to try again.
fn requeue_refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
) -> Result<Refused, AwsError> {
    if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    {
        let codes = cancellation_codes(cancelled.cancellation_reasons());
        if let Some(fault) = cancellation_fault(&codes) {
            return Err(AwsError::aws("TransactWriteItems(requeue)", fault, err));
        }
        match codes.as_slice() {
            ["ConditionalCheckFailed", ..] => return Ok(Refused::Task),
            [_, "ConditionalCheckFailed"] => return Ok(Refused::Counter),
            [_, _, "ConditionalCheckFailed"] => return Ok(Refused::Run),
            _ => {}
        }
    }
    Err(AwsError::from_sdk("TransactWriteItems(requeue)", err))
}

fn run_refused(task: &TaskRef) -> AwsError {
    let (job, run) = (&task.job_id, &task.run_id);
    AwsError::Refused {
        detail: format!("run {job}/{run} was cancelled or lost its counters"),
    }
}

/// How a run counts its tasks, as its item says: on the run item (v1), in counter shards
/// (v2), or not at all (a run written without counters).
pub fn counting_of(run: &Item) -> Option<Counting> {
    match Counting::of(number(run, "counter_shards")) {
        Counting::Shards(n) => Some(Counting::Shards(n)),
        Counting::Run => run.contains_key("tasks_remaining").then_some(Counting::Run),
    }
}

fn now() -> String {
    rfc3339(std::time::SystemTime::now())
}
