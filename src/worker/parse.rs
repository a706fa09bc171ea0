//! Stage 1, parse: an SQS record becomes one delivery of a task, or a poison message for
//! the quarantine (`park`).

use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use sha2::{Digest, Sha256};

use crate::batch::Invocation;
use crate::domain::message::{Message, Poison};
use crate::domain::model::DuplicatePolicy;
use crate::domain::time::epoch_millis;
use crate::trace::STEP;

use super::context::{Delivery, RecordSettings};
use super::sqs_record::{name_span, on_fifo, receive_count, sent_at};

/// Parses the record's body and reads its SQS attributes.
pub(super) fn delivery(
    record: &SqsMessage,
    settings: &RecordSettings,
    invocation: &Invocation,
) -> Result<Delivery, Poison> {
    let body = record.body.as_deref();
    let parsed = tracing::info_span!(target: STEP, "parse")
        .in_scope(|| Message::parse(body, sent_at(record)));
    let message = parsed?;
    name_span(&message.task);
    if message.redriven {
        tracing::info!("sent again long after its copy was written: a fresh set of tries");
    }
    let receives = receive_count(record) + message.carried.receives_before;
    Ok(Delivery {
        counted_receives: if on_fifo(record) { 1 } else { receives },
        wait_left: wait_left(settings, message.carried.polite_since),
        id: delivery_id(record, receives),
        owner: lease_owner(settings, invocation, record),
        fifo: on_fifo(record),
        receives,
        message,
    })
}

/// Under `DUPLICATE_POLICY=lease`, the lease owner for this delivery: the invocation's
/// request id plus the message id. So two copies of a task in one batch do not share a
/// lease either.
fn lease_owner(
    settings: &RecordSettings,
    invocation: &Invocation,
    record: &SqsMessage,
) -> Option<String> {
    match settings.duplicate_policy {
        DuplicatePolicy::Converge => None,
        DuplicatePolicy::Lease => Some(format!(
            "{}/{}",
            invocation.request_id,
            record.message_id.as_deref().unwrap_or_default()
        )),
    }
}

/// How much longer this task may wait for its host: `POLITE_MAX_WAIT_MS` from its first
/// wait (which a copy's body carries).
fn wait_left(settings: &RecordSettings, polite_since: Option<u64>) -> Duration {
    let now = epoch_millis(SystemTime::now()) as u64;
    let waited = polite_since.map_or(0, |since| now.saturating_sub(since));
    let max_wait = settings.politeness.max_wait;
    max_wait.saturating_sub(Duration::from_millis(waited))
}

/// A name for this delivery, at most 36 characters (a DynamoDB idempotency token). It is the
/// same for the same receive of a message, and different for any other, since the receipt
/// handle is new at every receive.
fn delivery_id(record: &SqsMessage, receives: u32) -> String {
    let message = record.message_id.as_deref().unwrap_or_default();
    let receipt = record.receipt_handle.as_deref().unwrap_or_default();
    let digest = Sha256::digest(format!("{message}#{receipt}#{receives}").as_bytes());
    hex::encode(&digest[..16])
}
