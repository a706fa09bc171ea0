//! The task store's table in DynamoDB: tasks, jobs, runs, counter shards, hosts and spend.
//!
//! One type, [`DynamoTaskStore`], over the whole table. It implements the worker's ports in
//! the folder of the item kind each serves (`TaskStore` in `tasks/`, `HostStore` in
//! `hosts/`, `SpendStore` in `spend/`). Its own methods are here (the shared requests) and
//! in `runs/` (what producers and operators read and write about a run); every other
//! helper is a function of its item kind's folder that takes the store.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use std::time::Duration;

use aws_sdk_dynamodb::types::{CancellationReason, KeysAndAttributes};

use crate::domain::ids::RunRef;
use crate::domain::ids::TaskRef;
use crate::ports::error::{StoreError, StoreFault};
use crate::store::lazy::Lazy;
use attributes::Item;
use expressions::Expression;

pub mod attributes;
pub mod expressions;
pub mod hosts;
pub mod jobs;
pub mod keys;
pub mod run_counters;
pub mod runs;
pub mod shards;
pub mod spend;
pub mod tasks;

/// The task store (`ports::tasks::TaskStore`), and the hosts, spend and runs, on one
/// DynamoDB table with string keys `pk` and `sk`.
#[derive(Debug, Clone)]
pub struct DynamoTaskStore {
    pub(crate) client: Lazy<Client>,
    pub(crate) table: String,
}

impl DynamoTaskStore {
    pub fn new(client: impl Into<Lazy<Client>>, table: impl Into<String>) -> Self {
        Self {
            client: client.into(),
            table: table.into(),
        }
    }

    /// An `UpdateItem` of the run item under this expression.
    pub(crate) fn update_run(
        &self,
        run: RunRef<'_>,
        expression: Expression,
    ) -> UpdateItemFluentBuilder {
        let (job, run_id) = (run.job_id, run.run_id);
        expression
            .apply_to(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(keys::run_key(job, run_id)))
    }

    /// An `UpdateItem` of the task under this expression.
    fn update_task(&self, task: &TaskRef, expression: Expression) -> UpdateItemFluentBuilder {
        expression
            .apply_to(self.client.update_item())
            .table_name(&self.table)
            .set_key(Some(keys::task_key(task)))
    }
}

/// How many times a batch read asks again for keys DynamoDB left unprocessed, as it does
/// when the table throttles, before that is an error.
const UNPROCESSED_ROUNDS: u32 = 5;

impl DynamoTaskStore {
    /// Every item that `asked` names and that exists (one table, at most 100 keys). Keys
    /// DynamoDB leaves unprocessed are asked for again after a growing, jittered pause: 50 ms,
    /// then doubling, never less than half of that. If keys are still unprocessed after
    /// [`UNPROCESSED_ROUNDS`], the read fails as throttled.
    pub(crate) async fn batch_get(
        &self,
        asked: KeysAndAttributes,
        operation: &'static str,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut asked = Some(asked);
        for round in 0..=UNPROCESSED_ROUNDS {
            let Some(request) = asked.take() else {
                return Ok(items);
            };
            if round > 0 {
                let ceiling = Duration::from_millis(50 << round);
                tokio::time::sleep(ceiling.mul_f64(0.5 + fastrand::f64() / 2.0)).await;
            }
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, request)
                .send()
                .await
                .map_err(|e| StoreError::from_sdk(operation, e))?;
            let mut responses = out.responses.unwrap_or_default();
            items.extend(responses.remove(&self.table).unwrap_or_default());
            asked = out
                .unprocessed_keys
                .and_then(|mut unprocessed| unprocessed.remove(&self.table))
                .filter(|left| !left.keys.is_empty());
        }
        match asked {
            None => Ok(items),
            Some(_) => {
                let left = "DynamoDB left keys unprocessed";
                Err(StoreError::failed(operation, StoreFault::Throttled, left))
            }
        }
    }
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
