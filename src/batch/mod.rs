//! One batch. Records run concurrently, within a concurrency limit and a deadline, and a
//! panic in one record does not affect the others. The partial batch response lists exactly
//! the records to redeliver.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use futures_util::{FutureExt, StreamExt, stream};
use tokio::time::Instant;
use tracing::{Instrument, Span, field};

mod handoffs;

pub use handoffs::{Handoffs, NotSent};

use crate::contract::{Outcome, Reply};
use crate::metrics::{Measures, Tally};
use crate::trace;

/// Processes one record into an outcome. The worker implements it, and so do fakes in tests.
pub trait ProcessRecord: Sync {
    fn process(
        &self,
        record: &SqsMessage,
        invocation: &Invocation,
    ) -> impl Future<Output = Outcome> + Send;

    /// What becomes of a record that the cutoff stopped, or that never started. This runs in
    /// the margin before the deadline. By default the record goes back to the queue.
    fn out_of_time(&self, _record: &SqsMessage) -> impl Future<Output = Outcome> + Send {
        std::future::ready(Outcome::OutOfTime)
    }

    /// What becomes of a record held behind an earlier record of its FIFO group that will be
    /// retried. By default it goes back to the queue with the group.
    fn held_in_group(&self, _record: &SqsMessage) -> impl Future<Output = Outcome> + Send {
        std::future::ready(Outcome::GroupHeld)
    }

    /// Runs after the batch's records and before its response. It settles what a sandbox
    /// must settle between invocations, since the sandbox may be frozen or recycled after.
    fn after_batch(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Metrics of the processor's own, counted since the last batch: (name, unit, value),
    /// written with the invocation's.
    fn take_measures(&self) -> Vec<(&'static str, &'static str, u64)> {
        Vec::new()
    }
}

/// What every record of one invocation shares.
#[derive(Debug)]
pub struct Invocation {
    /// The Lambda request id (the lease owner under `DUPLICATE_POLICY=lease`).
    pub request_id: String,
    /// The deadline in force: Lambda's, or [`FALLBACK_DEADLINE`] from the start when
    /// Lambda's had already passed.
    pub deadline: SystemTime,
    /// When the batch stops: `deadline_margin` before the deadline.
    pub cutoff: Instant,
    /// Fetch latencies and bytes stored, for the invocation's metrics.
    pub measures: Measures,
    /// The copies records sent to carry their message on.
    pub handoffs: Handoffs,
}

impl Invocation {
    pub fn new(request_id: &str, deadline: SystemTime, margin: Duration) -> Self {
        let now = SystemTime::now();
        let deadline = if deadline > now {
            deadline
        } else {
            tracing::warn!(
                fallback_secs = FALLBACK_DEADLINE.as_secs(),
                "the deadline had passed before the invocation started (cargo lambda watch?); \
                 using a deadline of 15 minutes from now"
            );
            now + FALLBACK_DEADLINE
        };
        let left = deadline.duration_since(now).unwrap_or_default();
        Self {
            request_id: request_id.to_owned(),
            deadline,
            cutoff: Instant::now() + left.saturating_sub(margin),
            measures: Measures::default(),
            handoffs: Handoffs::default(),
        }
    }
}

/// How much of a batch runs at once, and how early before the deadline it stops.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_concurrency: usize,
    pub deadline_margin: Duration,
}

/// How far off the deadline is set when Lambda's deadline had already passed as the
/// invocation started. Real Lambda never does that, but `cargo lambda watch` always does.
/// This is Lambda's longest timeout.
pub const FALLBACK_DEADLINE: Duration = Duration::from_secs(15 * 60);

/// Runs every record and builds the partial batch response.
pub async fn process_batch<P: ProcessRecord>(
    processor: &P,
    records: &[SqsMessage],
    request_id: &str,
    deadline: SystemTime,
    limits: BatchLimits,
) -> SqsBatchResponse {
    run_batch(processor, records, request_id, deadline, limits)
        .await
        .response
}

/// A batch's response, and its tally for the metrics.
#[derive(Debug)]
pub struct BatchRun {
    pub response: SqsBatchResponse,
    pub tally: Tally,
}

/// Runs every record. Returns the partial batch response and what the batch did.
///
/// Records of a FIFO message group (`MessageGroupId`) run one after another, in order. Once
/// one of them is to be retried, the rest of its group is retried without being processed,
/// so the group keeps its order. Groups, and records without a group, run concurrently, at
/// most `max_concurrency` at once.
pub async fn run_batch<P: ProcessRecord>(
    processor: &P,
    records: &[SqsMessage],
    request_id: &str,
    deadline: SystemTime,
    limits: BatchLimits,
) -> BatchRun {
    let span = tracing::info_span!("batch", request_id);
    let invocation =
        span.in_scope(|| Invocation::new(request_id, deadline, limits.deadline_margin));
    let outcomes = run_records(processor, records, &invocation, limits)
        .instrument(span.clone())
        .await;
    let settle = tokio::time::timeout_at(
        Instant::now() + remaining(&invocation).saturating_sub(LAST_WORDS),
        processor.after_batch(),
    );
    if settle.instrument(span.clone()).await.is_err() {
        tracing::warn!("no time left to settle the batch's reservations");
    }
    let response = span.in_scope(|| {
        let response = reply(records, &outcomes);
        tracing::info!(
            records = records.len(),
            retried = response.batch_item_failures.len(),
            "batch done"
        );
        response
    });
    let mut tally = Tally::of(&outcomes, invocation.measures);
    tally.own = processor.take_measures();
    BatchRun { response, tally }
}

/// Every record's outcome, in record order. `OutOfTime` for those the cutoff stopped.
async fn run_records<P: ProcessRecord>(
    processor: &P,
    records: &[SqsMessage],
    invocation: &Invocation,
    limits: BatchLimits,
) -> Vec<Outcome> {
    let outcomes: Mutex<Vec<Option<Outcome>>> = Mutex::new(records.iter().map(|_| None).collect());
    // Each record's span ends with its outcome; the cutoff's copy is sent within it too.
    let spans: Mutex<Vec<Option<Span>>> =
        Mutex::new(records.iter().map(record_span).map(Some).collect());
    let run = stream::iter(groups(records)).for_each_concurrent(limits.max_concurrency, |group| {
        let (outcomes, spans) = (&outcomes, &spans);
        async move {
            let mut held = false;
            for index in group {
                let span = lock(spans)[index].clone().unwrap_or_else(Span::none);
                let outcome = if held {
                    held_in_group(processor, &records[index])
                        .instrument(span)
                        .await
                } else {
                    run_one(processor, &records[index], invocation)
                        .instrument(span)
                        .await
                };
                held |= outcome.reply() == Reply::Retry;
                lock(outcomes)[index] = Some(outcome);
                lock(spans)[index] = None;
            }
        }
    });
    {
        let mut run = std::pin::pin!(run);
        if tokio::time::timeout_at(invocation.cutoff, &mut run)
            .await
            .is_err()
        {
            tracing::warn!(
                "the invocation deadline is near: unfinished records go back to the queue"
            );
            let_copies_land(&mut run, invocation).await;
        }
    }
    let outcomes = outcomes
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let spans = spans.into_inner().unwrap_or_else(PoisonError::into_inner);
    finish_cut(processor, records, (outcomes, spans), invocation, limits).await
}

/// At the cutoff, no copy starts, and the records sending one run on until it is sent (or
/// fails), within half the time kept for the cut records: a send is never cut in half.
async fn let_copies_land(run: &mut (impl Future<Output = ()> + Unpin), invocation: &Invocation) {
    invocation.handoffs.cut();
    let until = Instant::now() + remaining(invocation).saturating_sub(LAST_WORDS) / 2;
    let landed = async {
        tokio::select! {
            () = run => {}
            () = invocation.handoffs.settled() => {}
        }
    };
    if tokio::time::timeout_at(until, landed).await.is_err() {
        tracing::warn!("a copy was still being sent at the deadline");
    }
}

/// The outcomes, with those the cutoff stopped decided in their records' spans.
async fn finish_cut<P: ProcessRecord>(
    processor: &P,
    records: &[SqsMessage],
    (outcomes, spans): (Vec<Option<Outcome>>, Vec<Option<Span>>),
    invocation: &Invocation,
    limits: BatchLimits,
) -> Vec<Outcome> {
    let cut =
        (records.iter().zip(outcomes).zip(spans)).map(|((record, outcome), span)| async move {
            match outcome {
                Some(outcome) => outcome,
                None => {
                    let span = span.unwrap_or_else(Span::none);
                    out_of_time(processor, record, invocation)
                        .instrument(span)
                        .await
                }
            }
        });
    stream::iter(cut)
        .buffered(limits.max_concurrency.max(1))
        .collect()
        .await
}

/// A record the cutoff stopped. The processor decides its outcome within the deadline.
/// Otherwise it goes back to the queue.
async fn out_of_time<P: ProcessRecord>(
    processor: &P,
    record: &SqsMessage,
    invocation: &Invocation,
) -> Outcome {
    let message_id = record.message_id.as_deref().unwrap_or("");
    if let Some(outcome) = invocation.handoffs.outcome_of(message_id) {
        tracing::info!(
            message_id,
            "cut after its copy was sent: the copy carries it on"
        );
        traced(&outcome);
        return outcome;
    }
    tracing::warn!(
        message_id,
        outcome = "out_of_time",
        "record not finished before the deadline"
    );
    let until = Instant::now() + remaining(invocation).saturating_sub(LAST_WORDS);
    let outcome = tokio::time::timeout_at(until, processor.out_of_time(record))
        .await
        .unwrap_or(Outcome::OutOfTime);
    traced(&outcome);
    outcome
}

/// How long until the invocation's deadline.
fn remaining(invocation: &Invocation) -> Duration {
    invocation
        .deadline
        .duration_since(SystemTime::now())
        .unwrap_or_default()
}

/// The time kept before the deadline for the response itself, after the records the cutoff
/// stopped.
const LAST_WORDS: Duration = Duration::from_millis(250);

/// Record indexes by FIFO message group, in order of first appearance. A record without a
/// group, or from a standard queue, is a group of its own.
fn groups(records: &[SqsMessage]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        match fifo_group(record) {
            Some(group) => match by_id.get(group.as_str()) {
                Some(&g) => groups[g].push(index),
                None => {
                    by_id.insert(group, groups.len());
                    groups.push(vec![index]);
                }
            },
            None => groups.push(vec![index]),
        }
    }
    groups
}

/// The record's FIFO message group. Standard queues may carry a `MessageGroupId` too (SQS
/// fair queues), but it sets no order. Only a queue whose ARN ends in `.fifo` has groups.
fn fifo_group(record: &SqsMessage) -> Option<&String> {
    let fifo = record
        .event_source_arn
        .as_deref()
        .is_some_and(|arn| arn.ends_with(".fifo"));
    record.attributes.get("MessageGroupId").filter(|_| fifo)
}

/// The lock is only ever held to store one outcome, never across an await or a panic.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One record (in its span), with its panics caught, logged with its outcome.
async fn run_one<P: ProcessRecord>(
    processor: &P,
    record: &SqsMessage,
    invocation: &Invocation,
) -> Outcome {
    let started = Instant::now();
    let outcome = AssertUnwindSafe(processor.process(record, invocation))
        .catch_unwind()
        .await
        .unwrap_or(Outcome::Panicked);
    log(&outcome, started.elapsed());
    outcome
}

/// A record held behind an earlier one of its FIFO group. The processor decides its
/// outcome, which is logged in the record's span.
async fn held_in_group<P: ProcessRecord>(processor: &P, record: &SqsMessage) -> Outcome {
    let outcome = processor.held_in_group(record).await;
    log(&outcome, Duration::ZERO);
    outcome
}

/// The span of one record's log lines, and the delivery's span in its task's trace. The
/// worker fills in the task.
fn record_span(record: &SqsMessage) -> tracing::Span {
    let span = tracing::info_span!(
        "record",
        message_id = record.message_id.as_deref().unwrap_or(""),
        job_id = field::Empty,
        run_id = field::Empty,
        task_id = field::Empty,
        trace_id = field::Empty,
    );
    // Made within the batch's span: the invocation that runs this delivery.
    trace::continue_delivery(&span, record, &tracing::Span::current());
    span
}

/// The record's outcome on its span: what it was, and the reply. A task that failed, or a
/// failure the contract retries, marks the span as failed; a wait does not.
fn traced(outcome: &Outcome) {
    let label = outcome.label();
    let reply = match outcome.reply() {
        Reply::Ack => "ack",
        Reply::Retry => "retry",
    };
    trace::note("outcome", label);
    let failed = matches!(
        outcome,
        Outcome::FailedPermanently { .. }
            | Outcome::GaveUp { .. }
            | Outcome::Poison(_)
            | Outcome::Panicked
            | Outcome::Store(_)
            | Outcome::ScrapeTransient { .. }
            | Outcome::OutOfTime
            | Outcome::NoTimeLeft
    );
    match failed {
        true => trace::failed(label, reply),
        false => trace::note("reply", reply),
    }
}

fn log(outcome: &Outcome, elapsed: Duration) {
    traced(outcome);
    let (label, reply, ms) = (outcome.label(), outcome.reply(), elapsed.as_millis() as u64);
    match outcome {
        Outcome::Poison(why) => {
            tracing::warn!(outcome = label, ?reply, duration_ms = ms, reason = %why, "poison message acknowledged")
        }
        Outcome::Store(err) => {
            tracing::error!(outcome = label, ?reply, duration_ms = ms, error = ?err, "store failed")
        }
        Outcome::Panicked => {
            tracing::error!(outcome = label, ?reply, duration_ms = ms, "record panicked")
        }
        Outcome::FailedPermanently { reason }
        | Outcome::GaveUp { reason }
        | Outcome::ScrapeTransient { reason, .. } => {
            tracing::info!(outcome = label, ?reply, duration_ms = ms, reason = %reason, "record done")
        }
        Outcome::NotWanted(why) => {
            tracing::info!(outcome = label, ?reply, duration_ms = ms, why = ?why, "record done")
        }
        _ => tracing::info!(outcome = label, ?reply, duration_ms = ms, "record done"),
    }
}

/// The partial batch response: every record that is not acked, each message id once, and
/// never an empty id.
fn reply(records: &[SqsMessage], outcomes: &[Outcome]) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    let mut listed = HashSet::new();
    for (record, outcome) in records.iter().zip(outcomes) {
        if outcome.reply() == Reply::Ack {
            continue;
        }
        match record.message_id.as_deref() {
            Some(id) if !id.is_empty() => {
                if listed.insert(id) {
                    response.add_failure(id);
                }
            }
            _ => tracing::error!("a record to retry has no message id; it cannot be reported"),
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Does what each record's body says: `ack`, `retry`, `panic` or `sleep <ms>`.
    #[derive(Default)]
    struct Scripted {
        running: AtomicUsize,
        most_at_once: AtomicUsize,
        /// Message ids in the order their processing started.
        seen: Mutex<Vec<String>>,
    }

    impl ProcessRecord for Scripted {
        async fn process(&self, record: &SqsMessage, _invocation: &Invocation) -> Outcome {
            let id = record.message_id.clone().unwrap_or_default();
            lock(&self.seen).push(id);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_at_once.fetch_max(now, Ordering::SeqCst);
            let body = record.body.as_deref().unwrap_or_default();
            let outcome = match body.split_once(' ') {
                Some(("sleep", ms)) => {
                    let ms = ms.parse().expect("sleep takes milliseconds");
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Outcome::AlreadyTerminal
                }
                _ if body == "retry" => Outcome::ScrapeTransient {
                    reason: "HTTP 503".into(),
                    retry_after: None,
                },
                _ if body == "panic" => panic!("a bug in one record"),
                _ => Outcome::AlreadyTerminal,
            };
            self.running.fetch_sub(1, Ordering::SeqCst);
            outcome
        }
    }

    fn record(id: Option<&str>, body: &str) -> SqsMessage {
        let mut json = serde_json::json!({ "body": body });
        if let Some(id) = id {
            json["messageId"] = id.into();
        }
        serde_json::from_value(json).expect("a well-formed record")
    }

    fn limits(max_concurrency: usize) -> BatchLimits {
        BatchLimits {
            max_concurrency,
            deadline_margin: Duration::from_millis(200),
        }
    }

    fn in_a_minute() -> SystemTime {
        SystemTime::now() + Duration::from_secs(60)
    }

    async fn run(
        processor: &Scripted,
        records: &[SqsMessage],
        deadline: SystemTime,
        max_concurrency: usize,
    ) -> SqsBatchResponse {
        process_batch(processor, records, "req", deadline, limits(max_concurrency)).await
    }

    fn ids(reply: &SqsBatchResponse) -> Vec<&str> {
        reply
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect()
    }

    #[tokio::test]
    async fn a_panicking_record_is_retried_and_the_others_are_answered() {
        let records = [
            record(Some("a"), "ack"),
            record(Some("p"), "panic"),
            record(Some("r"), "retry"),
        ];

        let reply = run(&Scripted::default(), &records, in_a_minute(), 4).await;

        assert_eq!(ids(&reply), ["p", "r"]);
    }

    #[tokio::test]
    async fn no_more_than_max_concurrency_records_run_at_once() {
        let records: Vec<_> = (0..12)
            .map(|i| record(Some(&format!("m{i}")), "sleep 30"))
            .collect();
        let processor = Scripted::default();

        let reply = run(&processor, &records, in_a_minute(), 3).await;

        assert!(ids(&reply).is_empty());
        assert_eq!(processor.most_at_once.load(Ordering::SeqCst), 3);
    }

    /// Sends one copy of its record in the middle of its work: `before` ms of work, a send
    /// of `sending` ms (the copy is on its way from the send's first moment, as a request
    /// SQS may take however it ends here), then `after` ms more.
    struct Copying {
        before: u64,
        sending: u64,
        after: u64,
        copies: AtomicUsize,
    }

    impl ProcessRecord for Copying {
        async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
            let ms = Duration::from_millis;
            tokio::time::sleep(ms(self.before)).await;
            let send = async {
                self.copies.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(self.sending)).await;
                Ok::<(), ()>(())
            };
            let then = || Outcome::WaitCopied {
                delay: Duration::ZERO,
            };
            let id = record.message_id.as_deref().unwrap_or_default();
            let outcome = match invocation.handoffs.send(id, send, then).await {
                Ok(requeued) => requeued,
                Err(_) => Outcome::OutOfTime,
            };
            tokio::time::sleep(ms(self.after)).await;
            outcome
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_cut_at_any_moment_of_its_copys_send_leaves_one_live_message() {
        // Arrange: 40 ms of work, a 30 ms send, 40 ms more; the cutoff at every 5 ms.
        let (before, sending, after) = (40, 30, 40);
        for cut_at in (0..=before + sending + after + 10).step_by(5) {
            let processor = Copying {
                before,
                sending,
                after,
                copies: AtomicUsize::new(0),
            };
            let deadline = SystemTime::now() + Duration::from_millis(cut_at) + MARGIN;

            // Act
            let reply = run_copying(&processor, &[record(Some("m"), "wait")], deadline).await;

            // Assert: the copy, or the record back in the queue, never both nor neither.
            let copies = processor.copies.load(Ordering::SeqCst);
            let live = copies + ids(&reply).len();
            assert_eq!(
                live, 1,
                "cut at {cut_at} ms: {copies} copies, reply {reply:?}"
            );
        }
    }

    /// The deployed margin: 2 s before the deadline.
    const MARGIN: Duration = Duration::from_secs(2);

    async fn run_copying(
        processor: &Copying,
        records: &[SqsMessage],
        deadline: SystemTime,
    ) -> SqsBatchResponse {
        let limits = BatchLimits {
            max_concurrency: 1,
            deadline_margin: MARGIN,
        };
        process_batch(processor, records, "req", deadline, limits).await
    }

    #[tokio::test]
    async fn records_unfinished_near_the_deadline_are_retried_and_the_reply_is_in_time() {
        let records = [
            record(Some("fast"), "ack"),
            record(Some("slow"), "sleep 10000"),
            record(Some("queued"), "ack"),
        ];
        let started = Instant::now();
        let deadline = SystemTime::now() + Duration::from_millis(700);

        let reply = run(&Scripted::default(), &records, deadline, 2).await;

        assert_eq!(ids(&reply), ["slow"]);
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(700),
            "replied {took:?} after start"
        );
    }

    #[tokio::test]
    async fn records_never_started_before_the_deadline_are_retried() {
        let records = [
            record(Some("slow"), "sleep 10000"),
            record(Some("waiting"), "ack"),
        ];
        let deadline = SystemTime::now() + Duration::from_millis(500);

        let reply = run(&Scripted::default(), &records, deadline, 1).await;

        assert_eq!(ids(&reply), ["slow", "waiting"]);
    }

    #[tokio::test]
    async fn a_deadline_already_past_at_the_start_still_processes_the_batch() {
        // `cargo lambda watch` sends a deadline in the past.
        let records = [record(Some("a"), "sleep 50"), record(Some("r"), "retry")];
        let past = SystemTime::now() - Duration::from_secs(5);

        let reply = run(&Scripted::default(), &records, past, 4).await;

        assert_eq!(ids(&reply), ["r"]);
    }

    fn in_group(id: &str, group: &str, body: &str) -> SqsMessage {
        let mut message = record(Some(id), body);
        message
            .attributes
            .insert("MessageGroupId".into(), group.into());
        message.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:tasks.fifo".into());
        message
    }

    /// A record of a standard queue with a `MessageGroupId` (an SQS fair queue).
    fn in_fair_group(id: &str, group: &str, body: &str) -> SqsMessage {
        let mut message = in_group(id, group, body);
        message.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:tasks".into());
        message
    }

    #[tokio::test]
    async fn records_of_a_fair_queue_group_run_side_by_side_and_retry_alone() {
        let records = [
            in_fair_group("a1", "A", "retry"),
            in_fair_group("a2", "A", "sleep 60"),
            in_fair_group("a3", "A", "sleep 60"),
        ];
        let processor = Scripted::default();

        let reply = run(&processor, &records, in_a_minute(), 4).await;

        assert_eq!(ids(&reply), ["a1"]);
        assert_eq!(
            processor.most_at_once.load(Ordering::SeqCst),
            2,
            "a2 and a3 at once"
        );
    }

    #[tokio::test]
    async fn a_fifo_group_stops_at_its_first_retry_and_other_groups_go_on() {
        let records = [
            in_group("a1", "A", "ack"),
            in_group("b1", "B", "ack"),
            in_group("a2", "A", "retry"),
            in_group("b2", "B", "ack"),
            in_group("a3", "A", "ack"),
            in_group("a4", "A", "panic"),
            in_group("b3", "B", "retry"),
            record(Some("loose"), "ack"),
        ];
        let processor = Scripted::default();

        let reply = run(&processor, &records, in_a_minute(), 4).await;

        assert_eq!(ids(&reply), ["a2", "a3", "a4", "b3"]);
        let seen = lock(&processor.seen).clone();
        assert!(
            !seen.contains(&"a3".to_owned()) && !seen.contains(&"a4".to_owned()),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn records_of_a_group_run_in_order_and_groups_run_side_by_side() {
        let records = [
            in_group("a1", "A", "sleep 60"),
            in_group("a2", "A", "sleep 10"),
            in_group("b1", "B", "sleep 60"),
            in_group("b2", "B", "sleep 10"),
            in_group("a3", "A", "ack"),
        ];
        let processor = Scripted::default();
        let started = Instant::now();

        let reply = run(&processor, &records, in_a_minute(), 4).await;

        assert!(ids(&reply).is_empty());
        let seen = lock(&processor.seen).clone();
        let position = |id: &str| seen.iter().position(|s| s == id).expect("processed");
        assert!(
            position("a1") < position("a2") && position("a2") < position("a3"),
            "{seen:?}"
        );
        assert!(position("b1") < position("b2"), "{seen:?}");
        assert_eq!(
            processor.most_at_once.load(Ordering::SeqCst),
            2,
            "A and B at once"
        );
        assert!(
            started.elapsed() < Duration::from_millis(140),
            "groups overlapped"
        );
    }

    #[tokio::test]
    async fn the_reply_lists_each_message_id_once_and_never_an_empty_one() {
        let records = [
            record(Some("dup"), "retry"),
            record(Some("dup"), "retry"),
            record(Some(""), "retry"),
            record(None, "retry"),
            record(Some("ok"), "ack"),
        ];

        let reply = run(&Scripted::default(), &records, in_a_minute(), 4).await;

        assert_eq!(ids(&reply), ["dup"]);
    }
}
