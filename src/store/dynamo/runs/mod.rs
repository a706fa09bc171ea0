//! What operators and producers read and write about a run, on the task store's table: the
//! run item, its counter shards and groups, its tasks (a v3 run's from each of its
//! partitions, by Query, never a scan), and a failed task set back to pending with its
//! run's counters. Also what the producer creates (the job, the run with its counters or
//! counter tree, the tasks), and its submit cursor.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::KeysAndAttributes;
use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, TransactWriteItem};
use futures_util::{StreamExt, TryStreamExt, stream};

use crate::domain::ids::RunRef;
use crate::domain::ids::{Id, MAX_SPREAD, TaskRef};
use crate::domain::model::{Counting, ShardSizes, Sharding};
use crate::domain::refresh::{Prior, Validators};
use crate::domain::time::rfc3339;
use crate::ports::error::StoreError;
use crate::store::dynamo::attributes::{Item, n, number, s, string, strings};

use crate::store::dynamo::keys;
use crate::store::dynamo::shards::requeue;
pub use crate::store::dynamo::shards::requeue::Requeue;
use crate::store::dynamo::{
    DynamoTaskStore, cancellation_codes, is_condition_failure, run_counters, tasks,
};
use crate::store::error::cancellation_fault;

/// How a create ended: written now, or already there (returned as it is stored).
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    Written,
    Existing(Item),
}

/// How many counter items are created at once.
const COUNTER_PUTS_AT_ONCE: usize = 16;

impl DynamoTaskStore {
    /// The job, `active`, unless it exists already.
    pub async fn create_job(&self, job: &Id) -> Result<Created, StoreError> {
        let mut item = keys::job_key(job);
        item.extend(strings(&[("status", "active"), ("created_at", &now())]));
        self.create(item, "PutItem(job)").await
    }

    /// The run, `running`, with its submit cursor at 0, unless it exists already. It counts
    /// on its own item (`total` tasks, all remaining), or in the counter tree that `sizes`
    /// describes (data contract v2: `counter_shards`, `counter_groups`, and what the run
    /// counts as left). With `spread`, its tasks and results spread over its shards (v3:
    /// `task_shards`).
    pub async fn create_run(
        &self,
        run: RunRef<'_>,
        total: u64,
        (sizes, spread, refreshes): (Option<&ShardSizes>, bool, Option<&Id>),
    ) -> Result<Created, StoreError> {
        let (job, run_id) = (run.job_id, run.run_id);
        let mut item = keys::run_key(job, run_id);
        item.extend(strings(&[("status", "running"), ("created_at", &now())]));
        if let Some(earlier) = refreshes {
            item.insert("refreshes".into(), s(earlier.as_str()));
        }
        let counters = match sizes {
            None => vec![
                ("tasks_remaining", total),
                ("tasks_succeeded", 0),
                ("tasks_failed", 0),
            ],
            Some(sizes) => {
                let Sharding { shards, groups } = sizes.sharding;
                let mut counters = vec![("counter_shards", u64::from(shards))];
                if groups > 0 {
                    counters.push(("counter_groups", u64::from(groups)));
                }
                counters.push(sizes.run_children());
                if spread {
                    counters.push(("task_shards", u64::from(shards)));
                }
                counters
            }
        };
        let always = [("tasks_total", total), ("submitted_through", 0)];
        for (counter, value) in counters.into_iter().chain(always) {
            item.insert(counter.into(), n(value));
        }
        self.create(item, "PutItem(run)").await
    }

    /// The run's counter groups and shards, each with everything it counts still left to
    /// count, unless they exist already. A few are written at once.
    pub async fn create_counters(
        &self,
        job: &Id,
        run: &Id,
        sizes: &ShardSizes,
    ) -> Result<(), StoreError> {
        let groups = sizes
            .group_shards()
            .into_iter()
            .enumerate()
            .map(|(g, shards)| {
                let mut item = keys::group_key(job, run, g as u32);
                item.insert("shards_total".into(), n(shards));
                item.insert("shards_remaining".into(), n(shards));
                (item, "PutItem(group)")
            });
        let shards = sizes.shard_tasks.iter().enumerate().map(|(shard, tasks)| {
            let mut item = keys::shard_key(job, run, shard as u32);
            for (counter, value) in [
                ("tasks_total", *tasks),
                ("tasks_remaining", *tasks),
                ("tasks_succeeded", 0),
                ("tasks_failed", 0),
            ] {
                item.insert(counter.into(), n(value));
            }
            (item, "PutItem(shard)")
        });
        let creates = groups
            .chain(shards)
            .map(|(item, what)| self.create(item, what));
        stream::iter(creates)
            .buffer_unordered(COUNTER_PUTS_AT_ONCE)
            .try_for_each(|_| async { Ok(()) })
            .await
    }

    /// The task, `pending` with its URL, unless it exists already.
    pub async fn create_task(
        &self,
        task: &TaskRef,
        url: &str,
        prior: Option<&Prior>,
    ) -> Result<Created, StoreError> {
        let mut item = keys::task_key(task);
        item.extend(strings(&[("url", url), ("status", "pending")]));
        item.insert("created_at".into(), s(&now()));
        if let Some(prior) = prior {
            item.extend(prior_fields(prior));
        }
        self.create(item, "PutItem(task)").await
    }

    /// The results of these tasks of an earlier run that a refresh can carry forward, by
    /// task id. For each successful task: its object, SHA-256, validators and URL. Read 100
    /// at a time.
    pub async fn earlier_results(
        &self,
        refs: &[TaskRef],
    ) -> Result<std::collections::HashMap<String, (String, Prior)>, StoreError> {
        let keys = refs.iter().map(keys::task_key).collect();
        let asked = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
            .set_keys(Some(keys))
            .projection_expression(
                "sk, #url, #status, result_key, result_sha256, etag, last_modified",
            )
            .expression_attribute_names("#url", "url")
            .expression_attribute_names("#status", "status")
            .consistent_read(true)
            .build()
            .expect("keys, the required field, are set");
        let items = self
            .batch_get(asked, "BatchGetItem(earlier results)")
            .await?;
        let earlier = |item: &Item| {
            (string(item, "status") == Some("successful")).then_some(())?;
            let task = keys::task_of_sort(string(item, "sk")?)?.to_owned();
            let validators = Validators::parse(string(item, "etag"), string(item, "last_modified"));
            let result = (string(item, "result_key"), string(item, "result_sha256"));
            let prior = Prior::of(result, validators)?;
            Some((task, (string(item, "url")?.to_owned(), prior)))
        };
        Ok(items.iter().filter_map(earlier).collect())
    }

    /// Moves the run's submit cursor forward to `through` (never back).
    pub async fn advance_submitted(
        &self,
        job: &Id,
        run: &Id,
        through: u64,
    ) -> Result<(), StoreError> {
        let advance = writes::advance_submitted(through, &now());
        let result = self.update_run(RunRef::new(job, run), advance).send().await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(submitted)", err)),
        }
    }

    /// A conditional put that only creates. Returns the item as stored if it was there.
    async fn create(&self, item: Item, operation: &'static str) -> Result<Created, StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(writes::ABSENT)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Created::Written),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(e)) => {
                    Ok(Created::Existing(e.item().cloned().unwrap_or_default()))
                }
                _ => Err(StoreError::from_sdk(operation, err)),
            },
        }
    }
}

impl DynamoTaskStore {
    /// A failed task back to pending. If the run counts its tasks (`counting`), the task
    /// also goes back into its run's remaining count, or its counter tree's. Both happen in
    /// one transaction, so a task is never counted twice. A conflict is an error the caller
    /// may try again. A run cancelled meanwhile is refused.
    pub async fn requeue_failed(
        &self,
        task: &TaskRef,
        counting: Option<Counting>,
    ) -> Result<Requeue, StoreError> {
        let now = now();
        if let Some(Counting::Shards(sharding)) = counting {
            return requeue::requeue_sharded(self, task, sharding, &now).await;
        }
        let task_update =
            tasks::writes::requeue_task(&now).into_update(&self.table, keys::task_key(task));
        let mut items = vec![TransactWriteItem::builder().update(task_update).build()];
        if counting.is_some() {
            let run_key = keys::run_key(&task.job_id, &task.run_id);
            let run_update =
                run_counters::writes::requeue_run(&now).into_update(&self.table, run_key);
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

/// A re-queue whose transaction was cancelled: the task is no longer failed, a conflict to
/// try again, or the run was cancelled meanwhile.
fn requeue_refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
    task: &TaskRef,
) -> Result<Requeue, StoreError> {
    if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    {
        let codes = cancellation_codes(cancelled.cancellation_reasons());
        if let Some(fault) = cancellation_fault(&codes) {
            return Err(StoreError::failed(
                "TransactWriteItems(requeue)",
                fault,
                err,
            ));
        }
        match codes.as_slice() {
            ["ConditionalCheckFailed", ..] => return Ok(Requeue::NotFailed),
            [_, "ConditionalCheckFailed"] => {
                let (job, run) = (&task.job_id, &task.run_id);
                return Err(StoreError::NotAllowed {
                    detail: format!("run {job}/{run} was cancelled or lost its counters"),
                });
            }
            _ => {}
        }
    }
    Err(StoreError::from_sdk("TransactWriteItems(requeue)", err))
}

/// How many counter shards a run's tasks and results are spread over, if they are (data
/// contract v3: `task_shards`).
pub fn spread_of(run: &Item) -> Option<u32> {
    number(run, "task_shards").filter(|n| (1..=MAX_SPREAD).contains(n))
}

/// How many Queries of a v3 run's task partitions run at once.
const QUERIES_AT_ONCE: usize = 16;

/// How a run counts its tasks, as its item says: on the run item (v1), in counter shards
/// (v2), or not at all (a run written without counters).
pub fn counting_of(run: &Item) -> Option<Counting> {
    match Counting::of(number(run, "counter_shards"), number(run, "counter_groups")) {
        Counting::Run => run.contains_key("tasks_remaining").then_some(Counting::Run),
        sharded => Some(sharded),
    }
}

fn now() -> String {
    rfc3339(std::time::SystemTime::now())
}

pub(crate) mod writes;

/// A refresh task's earlier result, as the task item carries it for the worker.
fn prior_fields(prior: &Prior) -> Item {
    let mut item = strings(&[
        ("prior_result_key", prior.key.as_str()),
        ("prior_sha256", prior.sha256.as_str()),
    ]);
    if let Some(etag) = &prior.validators.etag {
        item.insert("prior_etag".into(), s(etag.as_str()));
    }
    if let Some(date) = &prior.validators.last_modified {
        item.insert("prior_last_modified".into(), s(date.as_str()));
    }
    item
}

impl DynamoTaskStore {
    /// The run item, read consistently. `None` when it does not exist.
    pub async fn run_item(&self, job: &Id, run: &Id) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::run_key(job, run)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetItem(run)", e))?;
        Ok(out.item)
    }

    /// The run's counter shards `0..shards`, read consistently, in no particular order.
    /// Missing ones are left out.
    pub async fn shard_items(
        &self,
        job: &Id,
        run: &Id,
        shards: u32,
    ) -> Result<Vec<Item>, StoreError> {
        let keys = (0..shards).map(|i| keys::shard_key(job, run, i)).collect();
        self.read_all(keys, "BatchGetItem(shards)").await
    }

    /// The run's counter groups `0..groups`, as [`Self::shard_items`].
    pub async fn group_items(
        &self,
        job: &Id,
        run: &Id,
        groups: u32,
    ) -> Result<Vec<Item>, StoreError> {
        let keys = (0..groups).map(|i| keys::group_key(job, run, i)).collect();
        self.read_all(keys, "BatchGetItem(groups)").await
    }

    /// The items with these keys, read consistently, a hundred keys per request. Keys
    /// DynamoDB left unprocessed are asked for again.
    async fn read_all(
        &self,
        keys: Vec<Item>,
        operation: &'static str,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        for chunk in keys.chunks(100) {
            let asked = KeysAndAttributes::builder()
                .set_keys(Some(chunk.to_vec()))
                .consistent_read(true)
                .build()
                .expect("keys, the one required field, are set");
            items.extend(self.batch_get(asked, operation).await?);
        }
        Ok(items)
    }

    /// Every task of the run, read consistently, in task order, as (task id, item). A v3
    /// run's tasks are read from each of its shards' partitions, as its item says: one Query
    /// each, a few at once, never a scan.
    pub async fn run_tasks(&self, job: &Id, run: &Id) -> Result<Vec<(String, Item)>, StoreError> {
        let run_item = self.run_item(job, run).await?;
        let spread = run_item.as_ref().and_then(spread_of);
        let partitions = keys::task_partitions(job, run, spread);
        let mut tasks: Vec<(String, Item)> = stream::iter(partitions)
            .map(|partition| self.partition_tasks(partition))
            .buffer_unordered(QUERIES_AT_ONCE)
            .try_concat()
            .await?;
        tasks.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(tasks)
    }

    /// The URL each of these tasks (at most 100) was created with, by task id. A task that
    /// is not there is left out.
    pub async fn stored_urls(
        &self,
        refs: &[TaskRef],
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        let keys = refs.iter().map(keys::task_key).collect();
        let asked = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
            .set_keys(Some(keys))
            .projection_expression("sk, #url")
            .expression_attribute_names("#url", "url")
            .consistent_read(true)
            .build()
            .expect("keys, the required field, are set");
        let items = self
            .batch_get(asked, "BatchGetItem(submitted tasks)")
            .await?;
        let url_of = |item: &Item| {
            let task = keys::task_of_sort(string(item, "sk")?)?;
            Some((task.to_owned(), string(item, "url")?.to_owned()))
        };
        Ok(items.iter().filter_map(url_of).collect())
    }

    /// The tasks under one partition key (a Query, paged).
    async fn partition_tasks(&self, partition: String) -> Result<Vec<(String, Item)>, StoreError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(&partition))
            .consistent_read(true)
            .into_paginator()
            .items()
            .send();
        let mut tasks = Vec::new();
        while let Some(item) = pages.next().await {
            let item = item.map_err(|e| StoreError::from_sdk("Query(tasks)", e))?;
            let sort = string(&item, "sk").unwrap_or_default();
            let task = keys::task_of_sort(sort).unwrap_or(sort).to_owned();
            tasks.push((task, item));
        }
        Ok(tasks)
    }
}
