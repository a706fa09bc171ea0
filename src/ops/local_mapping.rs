//! A local event source mapping: what Lambda's SQS integration does, against a queue in a
//! local emulator. Pollers long-poll batches, run them through the handler, delete exactly
//! the acknowledged messages and leave the rest to come back after their visibility timeout;
//! the queue's own redrive policy moves repeat failures to its dead-letter queue.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};

use crate::batch::{BatchLimits, ProcessRecord, process_batch};
use crate::store::error::StoreError;

/// How the mapping polls and invokes.
#[derive(Debug, Clone)]
pub struct EsmSettings {
    pub queue_url: String,
    pub queue_arn: String,
    /// Concurrent pollers, like concurrent Lambda instances.
    pub pollers: usize,
    /// Messages per batch (SQS allows at most 10 per receive).
    pub batch_size: i32,
    /// Long-poll wait per receive, in seconds (0 to 20).
    pub wait_seconds: i32,
    /// The invocation timeout each batch gets.
    pub timeout: Duration,
    pub limits: BatchLimits,
}

/// What the mapping did, counted as it goes.
#[derive(Debug, Default)]
pub struct EsmStats {
    pub batches: AtomicU64,
    pub received: AtomicU64,
    pub deleted: AtomicU64,
    pub retried: AtomicU64,
    /// SQS calls of the mapping itself that failed (it carries on, as Lambda's does).
    pub sqs_errors: AtomicU64,
    /// Message ids deleted after an ack.
    pub acked: Mutex<HashSet<String>>,
}

impl EsmStats {
    pub fn summary(&self) -> String {
        format!(
            "{} batches, {} messages received, {} acknowledged and deleted, {} left for retry, \
             {} failed SQS calls of the mapping",
            self.batches.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
            self.deleted.load(Ordering::Relaxed),
            self.retried.load(Ordering::Relaxed),
            self.sqs_errors.load(Ordering::Relaxed),
        )
    }
}

/// Runs `pollers` poll loops until `done` says stop (checked between batches). A failed SQS
/// call of the mapping is logged and counted and polling goes on, as with Lambda: a message
/// whose delete failed simply comes back.
pub async fn run<P: ProcessRecord>(
    sqs: &Client,
    processor: &P,
    settings: &EsmSettings,
    stats: &EsmStats,
    done: &(dyn Fn() -> bool + Sync),
) {
    let pollers = (0..settings.pollers).map(|n| poll(sqs, processor, settings, stats, done, n));
    futures_util::future::join_all(pollers).await;
}

/// How a watched run checks the queue, reports and ends.
pub struct Watch<'a> {
    /// How often the queue's depth is read.
    pub check_every: Duration,
    /// How often `report` is called (at most once per check).
    pub report_every: Duration,
    /// End once the queue has been empty (nothing visible, nothing in flight) for three
    /// checks in a row.
    pub until_drained: bool,
    /// End after this long in any case.
    pub limit: Option<Duration>,
    pub report: &'a (dyn Fn(&Progress<'_>) + Sync),
}

/// Where a watched run stands.
pub struct Progress<'a> {
    pub elapsed: Duration,
    /// Messages visible or in flight, if the queue answered.
    pub depth: Option<u64>,
    pub stats: &'a EsmStats,
}

/// Why a watched run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Drained,
    TimedOut,
    Stopped,
}

/// Runs the mapping while watching the queue: reports progress, and ends when the queue
/// has drained (if asked), the time limit passes, or `stop` completes (Ctrl-C, say).
/// Pollers finish the batch in hand before they stop.
pub async fn run_watched<P: ProcessRecord>(
    sqs: &Client,
    processor: &P,
    settings: &EsmSettings,
    stats: &EsmStats,
    watch: &Watch<'_>,
    stop: impl Future<Output = ()>,
) -> Ended {
    let done = AtomicBool::new(false);
    let is_done = || done.load(Ordering::Relaxed);
    let watching = async {
        let ended = self::watch(sqs, settings, stats, watch, stop).await;
        done.store(true, Ordering::Relaxed);
        ended
    };
    let ((), ended) = tokio::join!(run(sqs, processor, settings, stats, &is_done), watching);
    ended
}

async fn watch(
    sqs: &Client,
    settings: &EsmSettings,
    stats: &EsmStats,
    watch: &Watch<'_>,
    stop: impl Future<Output = ()>,
) -> Ended {
    let started = Instant::now();
    let mut last_report = started;
    let mut empty_checks = 0;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return Ended::Stopped,
            () = tokio::time::sleep(watch.check_every) => {}
        }
        let depth = match queue_depth(sqs, &settings.queue_url).await {
            Ok(depth) => Some(depth),
            Err(err) => {
                tracing::warn!(error = %err, "could not read the queue's depth");
                None
            }
        };
        empty_checks = if depth == Some(0) {
            empty_checks + 1
        } else {
            0
        };
        let elapsed = started.elapsed();
        if last_report.elapsed() >= watch.report_every {
            last_report = Instant::now();
            (watch.report)(&Progress {
                elapsed,
                depth,
                stats,
            });
        }
        if watch.until_drained && empty_checks >= 3 {
            return Ended::Drained;
        }
        if watch.limit.is_some_and(|limit| elapsed >= limit) {
            return Ended::TimedOut;
        }
    }
}

/// Messages visible or in flight, by the queue's own approximate counts.
pub async fn queue_depth(sqs: &Client, queue_url: &str) -> Result<u64, StoreError> {
    let counts = [
        QueueAttributeName::ApproximateNumberOfMessages,
        QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
    ];
    let out = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .set_attribute_names(Some(counts.to_vec()))
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("GetQueueAttributes", e))?;
    let attributes = out.attributes.unwrap_or_default();
    Ok(counts
        .iter()
        .filter_map(|name| attributes.get(name)?.parse::<u64>().ok())
        .sum())
}

/// The queue's ARN, which Lambda puts in every record as `eventSourceARN`.
pub async fn queue_arn(sqs: &Client, queue_url: &str) -> Result<Option<String>, StoreError> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("GetQueueAttributes", e))?;
    Ok(out
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn)))
}

async fn poll<P: ProcessRecord>(
    sqs: &Client,
    processor: &P,
    settings: &EsmSettings,
    stats: &EsmStats,
    done: &(dyn Fn() -> bool + Sync),
    poller: usize,
) {
    let mut invocation = 0_u64;
    while !done() {
        let messages = match receive(sqs, settings).await {
            Ok(messages) => messages,
            Err(err) => {
                failed(stats, &err).await;
                continue;
            }
        };
        if messages.is_empty() {
            if settings.wait_seconds == 0 {
                // Short polling: pause rather than spin on an empty queue.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        }
        invocation += 1;
        let records: Vec<SqsMessage> = messages
            .iter()
            .map(|m| to_record(m, &settings.queue_arn))
            .collect();
        let request_id = format!("local-{poller}-{invocation}");
        let deadline = SystemTime::now() + settings.timeout;
        let reply =
            process_batch(processor, &records, &request_id, deadline, settings.limits).await;
        let retry: HashSet<&str> = reply
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        let acked: Vec<&Message> = messages
            .iter()
            .filter(|m| !retry.contains(m.message_id().unwrap_or_default()))
            .collect();
        if let Err(err) = delete(sqs, settings, &acked).await {
            failed(stats, &err).await;
            continue;
        }
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats
            .received
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        stats
            .deleted
            .fetch_add(acked.len() as u64, Ordering::Relaxed);
        stats
            .retried
            .fetch_add(retry.len() as u64, Ordering::Relaxed);
        let mut ids = stats.acked.lock().unwrap_or_else(PoisonError::into_inner);
        ids.extend(
            acked
                .iter()
                .filter_map(|m| m.message_id().map(str::to_owned)),
        );
    }
}

async fn failed(stats: &EsmStats, err: &StoreError) {
    tracing::warn!(error = %err, "an SQS call of the event source mapping failed; polling on");
    stats.sqs_errors.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn receive(sqs: &Client, settings: &EsmSettings) -> Result<Vec<Message>, StoreError> {
    let out = sqs
        .receive_message()
        .queue_url(&settings.queue_url)
        .max_number_of_messages(settings.batch_size)
        .wait_time_seconds(settings.wait_seconds)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("ReceiveMessage", e))?;
    Ok(out.messages.unwrap_or_default())
}

async fn delete(
    sqs: &Client,
    settings: &EsmSettings,
    acked: &[&Message],
) -> Result<(), StoreError> {
    if acked.is_empty() {
        return Ok(());
    }
    let entries = acked.iter().enumerate().map(|(i, m)| {
        DeleteMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .receipt_handle(m.receipt_handle().unwrap_or_default())
            .build()
            .expect("id and receipt handle, the required fields, are set")
    });
    sqs.delete_message_batch()
        .queue_url(&settings.queue_url)
        .set_entries(Some(entries.collect()))
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("DeleteMessageBatch", e))?;
    Ok(())
}

/// An SQS message as Lambda's event source mapping hands it to the function.
pub fn to_record(message: &Message, queue_arn: &str) -> SqsMessage {
    let attributes: serde_json::Map<String, serde_json::Value> = message
        .attributes()
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.as_str().to_owned(), value.clone().into()))
        .collect();
    let region = queue_arn.split(':').nth(3).unwrap_or_default();
    let json = serde_json::json!({
        "messageId": message.message_id(),
        "receiptHandle": message.receipt_handle(),
        "body": message.body(),
        "md5OfBody": message.md5_of_body(),
        "attributes": attributes,
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    });
    // Every field is a string or a map of strings, as SqsMessage expects.
    serde_json::from_value(json).unwrap_or_default()
}
