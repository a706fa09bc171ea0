//! What runs spend through proxies. Each fetch's requests and bytes are added exactly once
//! to the counter item its task counts in: the run item, or its shard. The paid tier's budget
//! is reserved from the run item in chunks, each sandbox's under a lease of its own.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    CancellationReason, ConditionCheck, Delete, TransactWriteItem, Update,
};
use sha2::{Digest, Sha256};

use crate::domain::ids::RunRef;
use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::Counting;
use crate::domain::spend::{DeliverySpend, PaidLease, Reservation, Spend};
use crate::ports::error::StoreError;
use crate::ports::spend::SpendStore;

use crate::store::dynamo::attributes::{Item, n, number, s, string};
use crate::store::dynamo::expressions::Expression;
use crate::store::dynamo::keys;
use crate::store::dynamo::{DynamoTaskStore, cancellation_codes, is_condition_failure};
use crate::store::error::cancellation_fault;
/// The run's spend attributes by tier, as the operator reads them too.
pub use writes::{blocks_name, spend_names};

impl SpendStore for DynamoTaskStore {
    #[tracing::instrument(skip_all)]
    async fn record_spend(
        &self,
        task: &TaskRef,
        counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) -> Result<(), StoreError> {
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
        // Skipped if the task names this delivery as counted by its terminal write, whose
        // response was lost. The delivery is also the idempotency token, so a request the
        // SDK sends again after a lost response is not applied twice either.
        let result = self
            .client
            .transact_write_items()
            .transact_items(not_counted_by(&self.table, task, delivery))
            .transact_items(TransactWriteItem::builder().update(update).build())
            .client_request_token(delivery)
            .send()
            .await;
        let Err(err) = result else {
            return Ok(());
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(e)) =
            err.as_service_error()
        {
            match cancellation_codes(e.cancellation_reasons()).as_slice() {
                ["ConditionalCheckFailed", _] => {
                    tracing::info!(?spend, "the terminal write counted this spend already");
                    return Ok(());
                }
                [_, "ConditionalCheckFailed"] => {
                    tracing::warn!(?spend, "the run's counter item is gone: spend not counted");
                    return Ok(());
                }
                _ => {}
            }
        }
        Err(StoreError::from_sdk("TransactWriteItems(spend)", err))
    }

    #[tracing::instrument(skip_all, fields(chunk))]
    async fn reserve_paid(
        &self,
        run: RunRef<'_>,
        lease: &PaidLease,
        chunk: u64,
    ) -> Result<Reservation, StoreError> {
        let mut tries = 0;
        loop {
            match try_reserve(self, run, lease, chunk).await {
                Err(err) if err.is_conflict() && tries < CONFLICT_TRIES => tries += 1,
                answer => return answer,
            }
            // Others reserved or settled on the run item at the same time: a short, jittered
            // pause.
            let pause = 20 + fastrand::u64(..80) * tries;
            tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
        }
    }

    #[tracing::instrument(skip_all, fields(bytes))]
    async fn note_paid(
        &self,
        task: &TaskRef,
        holder: &str,
        bytes: u64,
        delivery: &str,
    ) -> Result<(), StoreError> {
        let (job, run) = (&task.job_id, &task.run_id);
        let marked = writes::paid_noted_by(delivery).into_update(&self.table, keys::task_key(task));
        let note =
            writes::note_paid(bytes).into_update(&self.table, keys::lease_key(job, run, holder));
        // Refused if the task names this delivery as noted already: a request the SDK sent
        // again after a lost answer. The token makes DynamoDB itself answer such a request
        // as the first one for 10 minutes.
        let sent = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(marked).build())
            .transact_items(TransactWriteItem::builder().update(note).build())
            .client_request_token(note_token(delivery))
            .send()
            .await;
        let Err(err) = sent else {
            return Ok(());
        };
        let reasons = refused_by_conditions("TransactWriteItems(note_paid)", err)?;
        let task_item = reasons.first().and_then(|r| r.item());
        if task_item.and_then(|item| string(item, writes::PAID_NOTED_BY)) == Some(delivery) {
            tracing::info!(bytes, "this delivery's paid spend was noted already");
            return Ok(());
        }
        // The lease was taken back (this sandbox was frozen past its expiry) or given back,
        // or the task is gone. The holder counts the spend when it gives the lease back.
        Err(StoreError::NotAllowed {
            detail: "the paid-tier lease or the task is gone".into(),
        })
    }

    #[tracing::instrument(skip_all, fields(unnoted))]
    async fn return_paid(
        &self,
        run: RunRef<'_>,
        holder: &str,
        unnoted: u64,
    ) -> Result<(), StoreError> {
        let (job, run_id) = (run.job_id, run.run_id);
        let mut tries = 0;
        loop {
            let answer = match lease_item(self, job, run_id, holder).await? {
                Some(lease) => settle_lease(self, run, &lease, unnoted).await,
                None if unnoted == 0 => return Ok(()),
                None => return count_unnoted(self, run, unnoted).await,
            };
            match answer {
                Ok(true) => return Ok(()),
                // Noted on, or taken back, since it was read. Read it again.
                Ok(false) if tries < CONFLICT_TRIES => {}
                Err(err) if err.is_conflict() && tries < CONFLICT_TRIES => {}
                Ok(false) => {
                    tracing::warn!(unnoted, "paid-tier lease changing under its give-back");
                    return Ok(());
                }
                Err(err) => return Err(err),
            }
            tries += 1;
        }
    }

    #[tracing::instrument(skip_all)]
    async fn reclaim_paid(&self, run: RunRef<'_>, now_ms: u64) -> Result<usize, StoreError> {
        let (job, run_id) = (run.job_id, run.run_id);
        let mut taken = 0;
        for lease in leases(self, job, run_id).await? {
            if number::<u64>(&lease, "expires_at_ms").is_some_and(|at| at < now_ms)
                && settle_lease(self, run, &lease, 0).await?
            {
                taken += 1;
            }
        }
        Ok(taken)
    }
}

/// The name of the task's attribute that holds the delivery whose spend its terminal write
/// counted.
const SPEND_DELIVERY: &str = "spend_delivery";

/// A check that the task's terminal write did not count `delivery`'s spend.
fn not_counted_by(table: &str, task: &TaskRef, delivery: &str) -> TransactWriteItem {
    let check = ConditionCheck::builder()
        .table_name(table)
        .set_key(Some(keys::task_key(task)))
        .condition_expression(format!(
            "attribute_not_exists({SPEND_DELIVERY}) OR {SPEND_DELIVERY} <> :delivery"
        ))
        .expression_attribute_values(":delivery", s(delivery))
        .build()
        .expect("table, key and condition, the required fields, are set");
    TransactWriteItem::builder().condition_check(check).build()
}

/// The idempotency token of the note of `delivery`'s paid spend. It differs from the
/// delivery's own, which its spend's record uses, since DynamoDB refuses a token used again
/// for another request.
fn note_token(delivery: &str) -> String {
    let digest = Sha256::digest(format!("note_paid#{delivery}").as_bytes());
    hex::encode(&digest[..16])
}

/// How many times a reservation pauses and tries again after it met another write of the
/// run item in a transaction (`TransactionConflict`). Production DynamoDB cancels
/// overlapping transactions.
const CONFLICT_TRIES: u64 = 4;

/// The cancellation reasons of a transaction refused by its conditions alone. Any other
/// failure (a conflict with another transaction, throttling) is classified as an error.
fn refused_by_conditions(
    operation: &'static str,
    err: SdkError<TransactWriteItemsError, HttpResponse>,
) -> Result<Vec<CancellationReason>, StoreError> {
    if let Some(TransactWriteItemsError::TransactionCanceledException(e)) = err.as_service_error() {
        let reasons = e.cancellation_reasons();
        match cancellation_fault(&cancellation_codes(reasons)) {
            None => return Ok(reasons.to_vec()),
            Some(fault) => return Err(StoreError::failed(operation, fault, err)),
        }
    }
    Err(StoreError::from_sdk(operation, err))
}

/// A lease's end. The item is deleted only if it is still as it was read (`seen`: its
/// reserved bytes, noted spend and expiry). So no reservation or note is lost between the
/// read and the delete. A note that comes after the lease is gone is refused, and its holder
/// counts that spend when it gives the lease back.
fn lease_ended(table: &str, key: Item, (reserved, noted, expires): (u64, u64, u64)) -> Delete {
    Delete::builder()
        .table_name(table)
        .set_key(Some(key))
        .condition_expression(
            "reserved = :reserved AND (attribute_not_exists(spent) OR spent = :noted) \
             AND expires_at_ms = :expires",
        )
        .expression_attribute_values(":reserved", n(reserved))
        .expression_attribute_values(":noted", n(noted))
        .expression_attribute_values(":expires", n(expires))
        .build()
        .expect("table and key, the required fields, are set")
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// What a refused reservation means, from the run item as it was. Spent when the bytes
/// reported as spent reach the budget, or there is no budget or no run. Otherwise held
/// elsewhere.
fn refusal(run: &Item) -> Reservation {
    let budget: Option<u64> = number(run, "paid_tier_budget_bytes");
    let spent: u64 = number(run, "paid_tier_spent_bytes").unwrap_or(0);
    match budget {
        Some(budget) if spent < budget => Reservation::Held,
        _ => Reservation::Spent,
    }
}

impl Expression {
    /// Names on the task item the delivery whose spend the same transaction counts. Nothing
    /// is named when it spent nothing. So its spend, recorded alone later, is not counted
    /// again.
    pub(crate) fn with_spend_by(mut self, spend: DeliverySpend<'_>) -> Self {
        if spend.spend.is_zero() || spend.delivery.is_empty() {
            return self;
        }
        let set = format!("{SPEND_DELIVERY} = :spend_delivery");
        self.update = match self.update.split_once("SET ") {
            Some((before, after)) => format!("{before}SET {set}, {after}"),
            None => format!("SET {set} {}", self.update).trim_end().to_owned(),
        };
        self.value(":spend_delivery", s(spend.delivery))
    }

    /// Adds one delivery's spend to the item (a counter item: the run or a shard), in the
    /// same `ADD` clause as its counts. Also adds the blocks it met, if it met any.
    pub(crate) fn with_spend(mut self, spend: &Spend) -> Self {
        let mut adds = Vec::new();
        for (tier, spent) in spend.spent() {
            let names = spend_names(tier);
            let figures = [spent.requests, spent.bytes, spent.wire_bytes];
            for ((name, figure), kind) in names.into_iter().zip(figures).zip(["r", "b", "w"]) {
                let placeholder = format!(":spent_{kind}{tier}");
                self = self.value(&placeholder, n(figure));
                adds.push((name, placeholder));
            }
        }
        let tiers = spend.spent().map(|(tier, spent)| (tier, spent.blocks));
        for (tier, blocks) in tiers.chain([(0, spend.direct_blocks())]) {
            if blocks > 0 {
                let placeholder = format!(":blocks{tier}");
                self = self.value(&placeholder, n(blocks));
                adds.push((blocks_name(tier), placeholder));
            }
        }
        self.with_adds(&adds)
    }
}

pub(crate) mod writes;

/// A chunk reserved and the holder's lease extended, in one transaction.
async fn try_reserve(
    store: &DynamoTaskStore,
    run: RunRef<'_>,
    lease: &PaidLease,
    chunk: u64,
) -> Result<Reservation, StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let run_write =
        writes::reserve_paid(chunk).into_update(&store.table, keys::run_key(job, run_id));
    let extended = writes::lease(chunk, lease.expires_at_ms)
        .into_update(&store.table, keys::lease_key(job, run_id, &lease.holder));
    let lease = TransactWriteItem::builder().update(extended).build();
    let operation = "TransactWriteItems(reserve_paid)";
    let Some(reasons) = with_lease(store, operation, run_write, lease).await? else {
        return Ok(Reservation::Granted);
    };
    // The run item as the refusal found it, or as it is now when the response does not
    // carry it.
    let run = match reasons.first().and_then(|r| r.item()) {
        Some(item) => Some(item.clone()),
        None => store.run_item(job, run_id).await?,
    };
    Ok(refusal(&run.unwrap_or_default()))
}

/// The run's leases (a Query of their partition, paged).
async fn leases(store: &DynamoTaskStore, job: &Id, run: &Id) -> Result<Vec<Item>, StoreError> {
    let mut pages = store
        .client
        .query()
        .table_name(&store.table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", s(&keys::lease_partition(job, run)))
        .consistent_read(true)
        .into_paginator()
        .items()
        .send();
    let mut leases = Vec::new();
    while let Some(item) = pages.next().await {
        leases.push(item.map_err(|e| StoreError::from_sdk("Query(leases)", e))?);
    }
    Ok(leases)
}

/// This holder's lease, read consistently, if it has one.
async fn lease_item(
    store: &DynamoTaskStore,
    job: &Id,
    run: &Id,
    holder: &str,
) -> Result<Option<Item>, StoreError> {
    let out = store
        .client
        .get_item()
        .table_name(&store.table)
        .set_key(Some(keys::lease_key(job, run, holder)))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("GetItem(lease)", e))?;
    Ok(out.item)
}

/// Settles a lease, as it was read, for the run, and ends it. What it noted as spent,
/// plus `unnoted`, counts as spent. That may go past its reserved bytes, and then the
/// run's reserved bytes grow by the difference. The rest goes back. Refused (`false`) if
/// the lease changed meanwhile.
async fn settle_lease(
    store: &DynamoTaskStore,
    run: RunRef<'_>,
    lease: &Item,
    unnoted: u64,
) -> Result<bool, StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let reserved: u64 = number(lease, "reserved").unwrap_or(0);
    let noted: u64 = number(lease, "spent").unwrap_or(0);
    let (Some(pk), Some(sk)) = (lease.get("pk"), lease.get("sk")) else {
        return Ok(false);
    };
    let key = Item::from([("pk".to_owned(), pk.clone()), ("sk".to_owned(), sk.clone())]);
    let spent = noted.saturating_add(unnoted);
    let seen = (reserved, noted, number(lease, "expires_at_ms").unwrap_or(0));
    let run_write = writes::return_paid(signed(reserved) - signed(spent), spent)
        .into_update(&store.table, keys::run_key(job, run_id));
    let ended = TransactWriteItem::builder()
        .delete(lease_ended(&store.table, key, seen))
        .build();
    let operation = "TransactWriteItems(settle_paid)";
    let refused = with_lease(store, operation, run_write, ended)
        .await?
        .is_some();
    if !refused {
        tracing::info!(reserved, spent, "a paid-tier lease settled for the run");
    }
    Ok(!refused)
}

/// Bytes spent under a lease that is gone. It was taken back before this sandbox gave it
/// back, and that counted them as unspent. They are counted as both reserved and spent.
async fn count_unnoted(
    store: &DynamoTaskStore,
    run: RunRef<'_>,
    unnoted: u64,
) -> Result<(), StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let request = writes::return_paid(-signed(unnoted), unnoted)
        .apply_to(store.client.update_item())
        .table_name(&store.table)
        .set_key(Some(keys::run_key(job, run_id)));
    match request.send().await {
        Ok(_) => Ok(()),
        Err(err) if is_condition_failure(&err) => {
            tracing::warn!(
                unnoted,
                "the run's paid-tier account is gone: spend not counted"
            );
            Ok(())
        }
        Err(err) => Err(StoreError::from_sdk("UpdateItem(count_unnoted)", err)),
    }
}

/// The run item's write and its lease's, in one transaction. `None` when done, or the
/// cancellation reasons when a condition refused it.
async fn with_lease(
    store: &DynamoTaskStore,
    operation: &'static str,
    run: Update,
    lease: TransactWriteItem,
) -> Result<Option<Vec<CancellationReason>>, StoreError> {
    let items = vec![TransactWriteItem::builder().update(run).build(), lease];
    let sent = store
        .client
        .transact_write_items()
        .set_transact_items(Some(items))
        .send()
        .await;
    match sent {
        Ok(_) => Ok(None),
        Err(err) => refused_by_conditions(operation, err).map(Some),
    }
}
