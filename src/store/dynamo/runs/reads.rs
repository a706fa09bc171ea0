//! The operator's reads of a run: its item, its counter shards and groups, and its tasks
//! (a v3 run's from each of its partitions, by Query, never a scan).

use crate::domain::ids::{Id, TaskRef};
use crate::ports::error::StoreError;
use crate::store::dynamo::DynamoTaskStore;
use crate::store::dynamo::attributes::{Item, s, string};
use crate::store::dynamo::keys;
use aws_sdk_dynamodb::types::KeysAndAttributes;
use futures_util::{StreamExt, TryStreamExt, stream};

use super::{QUERIES_AT_ONCE, spread_of};

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
