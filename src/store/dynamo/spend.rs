//! What runs spend through proxies: each fetch's requests and bytes added to the counter item
//! its task counts in (the run item, or its shard), exactly once; and the paid tier's budget,
//! reserved from the run item in chunks.

use std::future::Future;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::Counting;
use crate::domain::spend::Spend;
use crate::store::dynamo::expressions;
use crate::store::dynamo::keys;
use crate::store::dynamo::tasks::{DynamoTaskStore, cancellation_codes, is_condition_failure};
use crate::store::error::AwsError;

/// Where spend is counted and the paid tier's budget kept.
pub trait SpendStore: Send + Sync {
    /// Adds one delivery's spend to the counter item of `task`'s run. `delivery` names the
    /// delivery: the same one recorded twice (a retried request) counts once.
    fn record_spend(
        &self,
        task: &TaskRef,
        counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// Reserves `chunk` bytes of the run's paid-tier budget: `false` once the reserved bytes
    /// reach the budget (or the run has none).
    fn reserve_paid(
        &self,
        job: &Id,
        run: &Id,
        chunk: u64,
    ) -> impl Future<Output = Result<bool, AwsError>> + Send;
}

impl SpendStore for DynamoTaskStore {
    #[tracing::instrument(skip_all)]
    async fn record_spend(
        &self,
        task: &TaskRef,
        counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) -> Result<(), AwsError> {
        if spend.is_zero() {
            return Ok(());
        }
        let key = match counting {
            Counting::Run => keys::run_key(&task.job_id, &task.run_id),
            Counting::Shards(sharding) => {
                let shard = sharding.shard_of(&task.task_id);
                keys::shard_key(&task.job_id, &task.run_id, shard)
            }
        };
        let update = expressions::spend(spend).into_update(&self.table, key);
        // A transaction of one, for its idempotency token: a request the SDK sends again
        // after a lost answer is not applied twice.
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .client_request_token(delivery)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(e))
                    if cancellation_codes(e.cancellation_reasons())
                        == ["ConditionalCheckFailed"] =>
                {
                    tracing::warn!(?spend, "the run's counter item is gone: spend not counted");
                    Ok(())
                }
                _ => Err(AwsError::from_sdk("TransactWriteItems(spend)", err)),
            },
        }
    }

    #[tracing::instrument(skip_all, fields(chunk))]
    async fn reserve_paid(&self, job: &Id, run: &Id, chunk: u64) -> Result<bool, AwsError> {
        let reserve = expressions::reserve_paid(chunk);
        let result = self.update_run((job, run), reserve).send().await;
        match result {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(reserve_paid)", err)),
        }
    }
}
