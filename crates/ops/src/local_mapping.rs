//! A local event source mapping: what Lambda's SQS integration does, against a queue in a
//! local emulator. Pollers long-poll batches, run them through the handler, delete exactly
//! the acknowledged messages, and leave the rest to come back after their visibility
//! timeout. The queue's own redrive policy moves repeat failures to its dead-letter queue.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_sqs::types::Message;

use crate::count;
use conveyor_worker::batch::{BatchLimits, ProcessRecord, run_batch};
use conveyor_worker::metrics::Tally;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::store::sqs::{SqsQueue, to_record};

/// How long every SQS call may fail before a watched mapping gives up, by default.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// How the mapping polls and invokes.
#[derive(Debug, Clone)]
pub struct MappingSettings {
    /// The queue's ARN, which every record carries as `eventSourceARN`.
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
pub struct MappingStats {
    pub batches: AtomicU64,
    pub received: AtomicU64,
    pub deleted: AtomicU64,
    pub retried: AtomicU64,
    /// SQS calls of the mapping itself that failed (it carries on, as Lambda's does).
    pub sqs_errors: AtomicU64,
    /// Since when every SQS call has failed, and the last failure, while they do.
    pub failing: Mutex<Option<(Instant, String)>>,
    /// Message ids deleted after an ack.
    pub acked: Mutex<HashSet<String>>,
    /// Deliveries of a message that another poller held at that moment, and the ids held
    /// now. SQS delivers at least once, and under `DUPLICATE_POLICY=converge` both scrape.
    pub doubled: AtomicU64,
    held: Mutex<HashMap<String, usize>>,
    /// Those deliveries by the task their message names (its message id if the body names
    /// none), so a test can tell which pages may have been fetched more than once.
    doubled_tasks: Mutex<HashMap<String, u64>>,
    /// What the records came to: tasks that ended successful (by this mapping's
    /// deliveries), tasks that failed, and records acknowledged without work (already ended,
    /// not wanted, poison). Also the bytes stored.
    pub successful: AtomicU64,
    pub failed: AtomicU64,
    pub without_work: AtomicU64,
    pub bytes_stored: AtomicU64,
}

impl MappingStats {
    /// The batch's messages are held by a poller until `release`. A message that another
    /// poller holds too is counted as doubled, under the task it names.
    fn hold(&self, messages: &[Message]) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for message in messages {
            let Some(id) = message.message_id() else {
                continue;
            };
            let holders = held.entry(id.to_owned()).or_default();
            if *holders > 0 {
                self.doubled.fetch_add(1, Ordering::Relaxed);
                let mut tasks = self
                    .doubled_tasks
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                *tasks.entry(task_of(message, id)).or_default() += 1;
            }
            *holders += 1;
        }
    }

    /// The tasks whose messages were delivered to a poller while another held them, each
    /// with how many such deliveries it had. Each delivery may fetch the task's page once
    /// more than a single delivery would.
    pub fn doubled_tasks(&self) -> HashMap<String, u64> {
        let tasks = self
            .doubled_tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        tasks.clone()
    }

    fn release(&self, messages: &[Message]) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for id in messages.iter().filter_map(|m| m.message_id()) {
            if let Some(holders) = held.get_mut(id) {
                *holders -= 1;
                if *holders == 0 {
                    held.remove(id);
                }
            }
        }
    }

    /// A batch whose `acked` messages were deleted and the rest left for retry.
    fn count(&self, received: &[Message], acked: &[String]) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let received = received.len() as u64;
        let deleted = acked.len() as u64;
        self.received.fetch_add(received, Ordering::Relaxed);
        self.deleted.fetch_add(deleted, Ordering::Relaxed);
        self.retried
            .fetch_add(received - deleted, Ordering::Relaxed);
        let mut ids = self.acked.lock().unwrap_or_else(PoisonError::into_inner);
        ids.extend(acked.iter().cloned());
    }

    /// What a batch's records came to.
    fn tally(&self, tally: &Tally) {
        let add = |counter: &AtomicU64, n| counter.fetch_add(n, Ordering::Relaxed);
        add(&self.successful, tally.succeeded);
        add(&self.failed, tally.failed);
        add(
            &self.without_work,
            tally.duplicate_guarded + tally.not_wanted + tally.poison,
        );
        add(&self.bytes_stored, tally.bytes_stored);
    }

    /// An SQS call of the mapping answered: a streak of failures is over.
    fn answered(&self) {
        *self.failing.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// How long every SQS call has failed for, and the last failure, if they do.
    pub fn failing_for(&self) -> Option<(Duration, String)> {
        let failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        failing
            .as_ref()
            .map(|(since, last)| (since.elapsed(), last.clone()))
    }

    pub fn summary(&self) -> String {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        format!(
            "{}, {} received, {} acknowledged and deleted, {} left for retry, {} of the \
             mapping; tasks: {} successful, {} failed, {} already ended or not wanted; {} stored",
            count(load(&self.batches), "batch"),
            count(load(&self.received), "message"),
            load(&self.deleted),
            load(&self.retried),
            count(load(&self.sqs_errors), "failed SQS call"),
            load(&self.successful),
            load(&self.failed),
            load(&self.without_work),
            count(load(&self.bytes_stored), "byte"),
        )
    }
}

/// The task id a message's body names, or the message's id `id` if it names none.
fn task_of(message: &Message, id: &str) -> String {
    match conveyor_worker::domain::message::parse_body(message.body()) {
        Ok(task) => task.task_id.as_str().to_owned(),
        Err(_) => id.to_owned(),
    }
}

/// Runs `pollers` poll loops until `done` says stop, checked between batches. A failed SQS
/// call of the mapping is logged and counted, and polling goes on, as with Lambda. A message
/// whose delete failed simply comes back.
pub async fn run<P: ProcessRecord>(
    queue: &SqsQueue,
    processor: &P,
    settings: &MappingSettings,
    stats: &MappingStats,
    done: &(dyn Fn() -> bool + Sync),
) {
    let pollers = (0..settings.pollers).map(|n| poll(queue, processor, settings, stats, done, n));
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
    /// End once every SQS call has failed for this long.
    pub give_up_after: Duration,
    pub report: &'a (dyn Fn(&Progress<'_>) + Sync),
}

/// Where a watched run stands.
pub struct Progress<'a> {
    pub elapsed: Duration,
    /// Messages visible or in flight, if the queue answered.
    pub depth: Option<u64>,
    pub stats: &'a MappingStats,
}

/// Why a watched run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Drained,
    TimedOut,
    Stopped,
    /// Every SQS call failed for [`Watch::give_up_after`].
    Unreachable,
}

/// Runs the mapping while watching the queue: reports progress, and ends when the queue
/// has drained (if asked), the time limit passes, or `stop` completes (Ctrl-C, say).
/// Pollers finish the batch in hand before they stop.
pub async fn run_watched<P: ProcessRecord>(
    queue: &SqsQueue,
    processor: &P,
    settings: &MappingSettings,
    stats: &MappingStats,
    watch: &Watch<'_>,
    stop: impl Future<Output = ()>,
) -> Ended {
    let done = AtomicBool::new(false);
    let is_done = || done.load(Ordering::Relaxed);
    let watching = async {
        let ended = self::watch(queue, stats, watch, stop).await;
        done.store(true, Ordering::Relaxed);
        ended
    };
    let ((), ended) = tokio::join!(run(queue, processor, settings, stats, &is_done), watching);
    ended
}

async fn watch(
    queue: &SqsQueue,
    stats: &MappingStats,
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
        let depth = match queue.depth().await {
            Ok(depth) => Some(depth),
            Err(err) => {
                tracing::debug!(error = %err, "could not read the queue's depth");
                None
            }
        };
        if stats
            .failing_for()
            .is_some_and(|(failing, _)| failing >= watch.give_up_after)
        {
            return Ended::Unreachable;
        }
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

/// One poller: receive a batch, run it, delete what was acknowledged. Repeat until `done`.
async fn poll<P: ProcessRecord>(
    queue: &SqsQueue,
    processor: &P,
    settings: &MappingSettings,
    stats: &MappingStats,
    done: &(dyn Fn() -> bool + Sync),
    poller: usize,
) {
    let mut invocation = 0_u64;
    while !done() {
        let messages = match queue
            .receive(settings.batch_size, settings.wait_seconds)
            .await
        {
            Ok(messages) => messages,
            Err(err) => {
                failed(stats, &err).await;
                continue;
            }
        };
        stats.answered();
        if messages.is_empty() {
            if settings.wait_seconds == 0 {
                // Short polling: pause rather than spin on an empty queue.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        }
        invocation += 1;
        let request_id = format!("local-{poller}-{invocation}");
        stats.hold(&messages);
        let invoked = invoke(queue, processor, settings, &messages, &request_id).await;
        stats.release(&messages);
        match invoked {
            Ok((acked, tally)) => {
                stats.count(&messages, &acked);
                stats.tally(&tally);
            }
            Err(err) => failed(stats, &err).await,
        }
    }
}

/// One invocation: run the batch through the processor, then delete the acknowledged
/// messages. Returns the ids deleted, and what the records came to.
async fn invoke<P: ProcessRecord>(
    queue: &SqsQueue,
    processor: &P,
    settings: &MappingSettings,
    messages: &[Message],
    request_id: &str,
) -> Result<(Vec<String>, Tally), StoreError> {
    let records: Vec<SqsMessage> = messages
        .iter()
        .map(|m| to_record(m, &settings.queue_arn))
        .collect();
    let deadline = SystemTime::now() + settings.timeout;
    let run = run_batch(processor, &records, request_id, deadline, settings.limits).await;
    let retry: HashSet<&str> = run
        .response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    let acked: Vec<&Message> = messages
        .iter()
        .filter(|m| !retry.contains(m.message_id().unwrap_or_default()))
        .collect();
    queue.delete(&acked).await?;
    let ids = acked
        .iter()
        .filter_map(|m| m.message_id().map(str::to_owned))
        .collect();
    Ok((ids, run.tally))
}

/// A failed SQS call of the mapping. It is counted, and logged as a warning only at the
/// start of a streak. Then it pauses, longer as the streak grows (up to 5 s), so an emulator
/// that is gone is not asked 20 times a second.
async fn failed(stats: &MappingStats, err: &StoreError) {
    let calls = stats.sqs_errors.fetch_add(1, Ordering::Relaxed);
    let (first, streak) = {
        let mut failing = stats.failing.lock().unwrap_or_else(PoisonError::into_inner);
        let first = failing.is_none();
        let since = failing
            .as_ref()
            .map_or_else(Instant::now, |(since, _)| *since);
        *failing = Some((since, err.to_string()));
        (first, since.elapsed())
    };
    if first || calls == 0 {
        tracing::warn!(error = %err, "an SQS call of the event source mapping failed; polling on");
    } else {
        tracing::debug!(error = %err, "an SQS call of the event source mapping failed");
    }
    let pause = Duration::from_millis(200).saturating_add(streak / 4);
    tokio::time::sleep(pause.min(Duration::from_secs(5))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, task: &str) -> Message {
        let body = format!(r#"{{"job_id":"j","run_id":"r","task_id":"{task}"}}"#);
        Message::builder().message_id(id).body(body).build()
    }

    #[test]
    fn a_message_held_by_two_pollers_at_once_is_recorded_under_its_task() {
        let stats = MappingStats::default();
        let first = [message("m1", "t1"), message("m2", "t2")];
        let second = [message("m2", "t2"), message("m3", "t3")];

        stats.hold(&first);
        stats.hold(&second);
        stats.release(&first);
        stats.hold(&[message("m1", "t1")]);

        assert_eq!(stats.doubled.load(Ordering::Relaxed), 1);
        let doubled = stats.doubled_tasks();
        assert_eq!(doubled, HashMap::from([("t2".to_owned(), 1)]));
    }

    #[test]
    fn a_doubled_message_without_a_task_is_recorded_under_its_message_id() {
        let stats = MappingStats::default();
        let poison = Message::builder().message_id("m9").body("not JSON").build();

        stats.hold(std::slice::from_ref(&poison));
        stats.hold(std::slice::from_ref(&poison));
        stats.hold(&[poison]);

        assert_eq!(stats.doubled_tasks(), HashMap::from([("m9".to_owned(), 2)]));
    }
}
