//! What runs spend through proxies: each fetch's requests and bytes added to the counter item
//! its task counts in (the run item, or its shard), exactly once; and the paid tier's budget,
//! reserved from the run item in chunks.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValuesOnConditionCheckFailure, TransactWriteItem};

use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::Counting;
use crate::domain::spend::{Reservation, Spend};
use crate::ports::error::AwsError;
use crate::ports::spend::SpendStore;

use crate::store::dynamo::attributes::{Item, n, number};
use crate::store::dynamo::expressions::Expression;
use crate::store::dynamo::keys;
use crate::store::dynamo::{DynamoTaskStore, cancellation_codes, is_condition_failure};
use writes::spend_names;

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
        let update = writes::spend(spend).into_update(&self.table, key);
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
    async fn reserve_paid(&self, job: &Id, run: &Id, chunk: u64) -> Result<Reservation, AwsError> {
        let reserve = writes::reserve_paid(chunk);
        let result = self
            .update_run((job, run), reserve)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Reservation::Granted),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => {
                    Ok(refusal(e.item().unwrap_or(&Default::default())))
                }
                _ => Err(AwsError::from_sdk("UpdateItem(reserve_paid)", err)),
            },
        }
    }

    #[tracing::instrument(skip_all, fields(unspent, spent))]
    async fn return_paid(
        &self,
        job: &Id,
        run: &Id,
        (unspent, spent): (u64, u64),
    ) -> Result<(), AwsError> {
        let give_back = writes::return_paid(unspent, spent);
        match self.update_run((job, run), give_back).send().await {
            Ok(_) => Ok(()),
            // The run is gone, or holds less reserved than that (an operator reset it).
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(return_paid)", err)),
        }
    }
}

/// What a refused reservation says, from the run item as it was: spent when the bytes given
/// back as spent reach the budget (or there is no budget, or no run), else held elsewhere.
fn refusal(run: &Item) -> Reservation {
    let budget: Option<u64> = number(run, "paid_tier_budget_bytes");
    let spent: u64 = number(run, "paid_tier_spent_bytes").unwrap_or(0);
    match budget {
        Some(budget) if spent < budget => Reservation::Held,
        _ => Reservation::Spent,
    }
}

impl Expression {
    /// With one delivery's spend added to the item (a counter item: the run or a shard),
    /// in the same `ADD` clause as its counts.
    pub(crate) fn with_spend(mut self, spend: &Spend) -> Self {
        let mut adds = Vec::new();
        for (tier, spent) in spend.spent() {
            let (requests, bytes) = spend_names(tier);
            adds.push(format!("{requests} :spent_r{tier}, {bytes} :spent_b{tier}"));
            self = self
                .value(&format!(":spent_r{tier}"), n(spent.requests))
                .value(&format!(":spent_b{tier}"), n(spent.bytes));
        }
        if adds.is_empty() {
            return self;
        }
        let adds = adds.join(", ");
        self.update = match self.update.split_once("ADD ") {
            Some((before, after)) => format!("{before}ADD {adds}, {after}"),
            None => format!("{} ADD {adds}", self.update)
                .trim_start()
                .to_owned(),
        };
        self
    }
}

/// The writes of this item kind.
pub(crate) mod writes {
    use crate::domain::spend::Spend;
    use crate::store::dynamo::attributes::n;
    use crate::store::dynamo::expressions::Expression;

    /// The names of tier `tier`'s spend on a counter item: requests and body bytes received.
    pub fn spend_names(tier: usize) -> (String, String) {
        (
            format!("proxy_requests_t{tier}"),
            format!("proxy_bytes_t{tier}"),
        )
    }

    /// One delivery's spend added to an existing counter item (run or shard), alone.
    pub(crate) fn spend(spend: &Spend) -> Expression {
        Expression::new(String::new(), "attribute_exists(pk)").with_spend(spend)
    }

    /// A chunk of the run's paid-tier budget reserved, while what is reserved is below it.
    pub(crate) fn reserve_paid(chunk: u64) -> Expression {
        Expression::new(
        "SET paid_tier_reserved_bytes = if_not_exists(paid_tier_reserved_bytes, :zero) + :chunk"
            .into(),
        "attribute_exists(paid_tier_budget_bytes) AND \
         (attribute_not_exists(paid_tier_reserved_bytes) \
         OR paid_tier_reserved_bytes < paid_tier_budget_bytes)",
    )
    .value(":zero", n(0))
    .value(":chunk", n(chunk))
    }

    /// `unspent` bytes reserved given back (never below nothing reserved), `spent` counted.
    pub(crate) fn return_paid(unspent: u64, spent: u64) -> Expression {
        Expression::new(
            "SET paid_tier_reserved_bytes = paid_tier_reserved_bytes - :unspent \
             ADD paid_tier_spent_bytes :spent"
                .into(),
            "paid_tier_reserved_bytes >= :unspent",
        )
        .value(":unspent", n(unspent))
        .value(":spent", n(spent))
    }
}
