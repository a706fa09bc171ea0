//! The task store's table in DynamoDB: tasks, jobs, runs, counter shards, hosts and spend.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::CancellationReason;

use crate::domain::ids::{Id, TaskRef};
use expressions::Expression;

pub mod attributes;
pub mod expressions;
pub mod hosts;
pub mod keys;
pub mod run_counters;
pub mod runs;
pub mod shards;
pub mod spend;
pub mod tasks;

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

pub(crate) fn is_condition_failure<R>(err: &SdkError<UpdateItemError, R>) -> bool {
    err.as_service_error()
        .is_some_and(|e| e.is_conditional_check_failed_exception())
}

/// The cancellation reason codes of a transaction's items, in item order (`None` for an item
/// that was fine).
pub(crate) fn cancellation_codes(reasons: &[CancellationReason]) -> Vec<&str> {
    reasons.iter().map(|r| r.code().unwrap_or("None")).collect()
}
