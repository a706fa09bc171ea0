//! One trace per task. Each delivery's `record` span continues the trace that its message
//! carries in SQS's `AWSTraceHeader` (the X-Ray format), and every copy the worker sends
//! carries the trace on. Spans are plain `tracing` spans; the wiring exports them by OTLP
//! when tracing is on. With tracing off, each call here is a cheap no-op, and a copy carries
//! the producer's header on unchanged.
//!
//! Every file of the traces feature: here (the trace a message carries); the exporter and
//! its settings in `wiring/traces.rs` and `wiring/aws.rs`, the spans buffered until the
//! invocation's flush in `wiring/span_buffer.rs`; the `record` span in
//! `batch/mod.rs`; the step spans in `worker/parse.rs`, `worker/admit.rs`,
//! `worker/fetch/mod.rs` and `scraper/spans.rs`; an error marked on its span in
//! `store/error.rs`; a copy's header in `ports/queue.rs` and `worker/park.rs`, and a
//! redriven message's in `crates/ops/src/redrive.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use aws_lambda_events::event::sqs::SqsMessage;
use opentelemetry::trace::{
    SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, Value};
use opentelemetry_aws::trace::xray_propagator::{span_context_from_str, span_context_to_string};
use sha2::{Digest, Sha256};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of the spans made for traces alone (a step's, a hop's). Log lines leave them
/// out, so with tracing off they cost nothing. `instrument` attributes spell it out.
pub const STEP: &str = "conveyor_step";

/// The SQS system attribute that carries a message's trace.
pub const HEADER: &str = "AWSTraceHeader";
/// The longest trace header passed on. X-Ray's own are under 128 bytes; a longer or
/// non-ASCII one is dropped, not stored anywhere.
pub const MAX_HEADER_BYTES: usize = 256;

static ON: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The share of undecided traces kept (an f64's bits).
static SHARE: AtomicU64 = AtomicU64::new(0);

/// Called once by the wiring after it installed the exporter: `share` of the traces whose
/// producer left the decision open are kept.
pub fn switch_on(share: f64) {
    SHARE.store(share.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

/// Back to off, for a process that measures both (the benchmarks).
pub fn switch_off() {
    ON.store(false, Ordering::Relaxed);
}

pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Counts spans whose export failed (the collector down or slow).
pub fn count_dropped(spans: u64) {
    DROPPED.fetch_add(spans, Ordering::Relaxed);
}

/// The spans dropped since the last call, for the batch's metrics.
pub fn take_dropped() -> u64 {
    DROPPED.swap(0, Ordering::Relaxed)
}

/// The trace header `record` carries, if it is short printable ASCII.
pub fn carried(record: &SqsMessage) -> Option<&str> {
    let header = record.attributes.get(HEADER)?;
    let fits = header.len() <= MAX_HEADER_BYTES && header.bytes().all(|b| b.is_ascii_graphic());
    fits.then_some(header.as_str())
}

/// Makes `span`, a delivery's span, continue the trace `record` carries, or else the trace
/// of the message itself ([`of_message`]). The span links to `invocation`, the span of the
/// Lambda invocation that ran it. Its `trace_id` field gets the trace's id in X-Ray's form.
pub fn continue_delivery(span: &Span, record: &SqsMessage, invocation: &Span) {
    if !is_on() {
        return;
    }
    let parent = carried(record)
        .and_then(span_context_from_str)
        .or_else(|| of_message(record))
        .map_or_else(Context::new, |remote| {
            Context::new().with_remote_span_context(decided(remote))
        });
    // The span is new here, so it has not started: its parent can still be set.
    let _ = span.set_parent(parent);
    let invoked = invocation.context().span().span_context().clone();
    if invoked.is_valid() {
        span.add_link(invoked);
    }
    if let Some(id) = xray_trace_id(span.context().span().span_context()) {
        span.record("trace_id", id.as_str());
    }
}

/// The trace of a message its producer sent without a header. Its id is made from the
/// message's id and the time SQS took it (X-Ray's ids begin with that time), so every
/// receive of the message is in the same trace; its copies carry it on. The sampling
/// decision is left open, so the share of traces kept decides it, alike for each receive.
fn of_message(record: &SqsMessage) -> Option<SpanContext> {
    let id = record.message_id.as_deref()?;
    let sent_ms: u64 = record.attributes.get("SentTimestamp")?.parse().ok()?;
    let digest = Sha256::digest(id.as_bytes());
    let mut trace = [0_u8; 16];
    trace[..4].copy_from_slice(&u32::try_from(sent_ms / 1000).ok()?.to_be_bytes());
    trace[4..].copy_from_slice(&digest[..12]);
    let mut parent = [0_u8; 8];
    parent.copy_from_slice(&digest[12..20]);
    let deferred = TraceFlags::new(0x02);
    let (trace, parent) = (TraceId::from_bytes(trace), SpanId::from_bytes(parent));
    Some(SpanContext::new(
        trace,
        parent,
        deferred,
        true,
        TraceState::default(),
    ))
}

/// A producer's decision stands (`Sampled=1`, `Sampled=0`). An open one (`Sampled=?`, or
/// none) is made here, by the trace id, so every delivery of the task decides alike, and
/// the copies say what was decided.
fn decided(remote: SpanContext) -> SpanContext {
    if !is_deferred(remote.trace_flags()) {
        return remote;
    }
    let share = f64::from_bits(SHARE.load(Ordering::Relaxed));
    let id = remote.trace_id().to_bytes();
    let mut low = [0_u8; 8];
    low.copy_from_slice(&id[8..]);
    // The id's random low half, against the share of its range (as OpenTelemetry's
    // TraceIdRatioBased sampler compares it).
    let kept = (u64::from_be_bytes(low) >> 1) < (share * (1_u64 << 63) as f64) as u64;
    let flags = if kept {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let state = remote.trace_state().clone();
    SpanContext::new(remote.trace_id(), remote.span_id(), flags, true, state)
}

/// The trace header for a copy of `record` sent from within its delivery: the delivery's own
/// span, so the next delivery is its child. With tracing off, the header it came with.
pub fn for_copy(record: &SqsMessage) -> Option<String> {
    if is_on() {
        let cx = Span::current().context();
        if let Some(header) = span_context_to_string(cx.span().span_context()) {
            return Some(header);
        }
    }
    carried(record).map(str::to_owned)
}

/// The trace's id in X-Ray's form, `1-<8 hex digits of time>-<24 hex digits>`.
fn xray_trace_id(context: &SpanContext) -> Option<String> {
    if !context.is_valid() {
        return None;
    }
    let hex = format!("{:032x}", context.trace_id());
    Some(format!("1-{}-{}", &hex[..8], &hex[8..]))
}

/// Sets an attribute on the current span. Values must come bounded: ids, a host, a count.
pub fn note(key: &'static str, value: impl Into<Value>) {
    if is_on() {
        Span::current().set_attribute(key, value);
    }
}

/// Marks the current span as the one that met an error, classified as the ack contract
/// classifies its outcome (`class`, e.g. `store_error`) and answers it (`reply`).
pub fn failed(class: &'static str, reply: &'static str) {
    if is_on() {
        let span = Span::current();
        span.set_attribute("error.class", class);
        span.set_attribute("reply", reply);
        span.set_status(Status::error(class));
    }
}

/// Whether a header's sampling decision was left to the receiver (`Sampled=?`, or none).
fn is_deferred(flags: TraceFlags) -> bool {
    const DEFERRED: TraceFlags = TraceFlags::new(0x02);
    flags & DEFERRED == DEFERRED
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn record_with(header: Option<&str>) -> SqsMessage {
        let mut record = SqsMessage::default();
        let attributes: HashMap<String, String> = header
            .map(|h| (HEADER.to_owned(), h.to_owned()))
            .into_iter()
            .collect();
        record.attributes = attributes;
        record
    }

    const PRODUCER: &str =
        "Root=1-6751b3e2-8e5b1a0c4f2d3e6a7b9c0d1e;Parent=53995c3f42cd8ad8;Sampled=1";

    #[test]
    fn a_well_formed_header_is_carried_and_a_long_or_odd_one_is_not() {
        assert_eq!(carried(&record_with(Some(PRODUCER))), Some(PRODUCER));
        let long = format!("{PRODUCER};Lineage={}", "a".repeat(MAX_HEADER_BYTES));
        assert_eq!(carried(&record_with(Some(&long))), None);
        assert_eq!(carried(&record_with(Some("Root=1-é"))), None);
        assert_eq!(carried(&record_with(None)), None);
    }

    #[test]
    fn with_tracing_off_a_copy_carries_the_header_it_came_with() {
        assert_eq!(
            for_copy(&record_with(Some(PRODUCER))).as_deref(),
            Some(PRODUCER)
        );
        assert_eq!(for_copy(&record_with(None)), None);
    }

    #[test]
    fn an_xray_trace_id_has_the_time_then_the_rest() {
        let context = span_context_from_str(PRODUCER).expect("a header");
        let id = xray_trace_id(&context).expect("valid");
        assert_eq!(id, "1-6751b3e2-8e5b1a0c4f2d3e6a7b9c0d1e");
    }

    #[test]
    fn a_message_without_a_header_has_one_trace_for_every_receive_and_undecided() {
        let received = |id: &str, sent: &str| {
            let mut record = record_with(None);
            record.message_id = Some(id.into());
            record
                .attributes
                .insert("SentTimestamp".into(), sent.into());
            of_message(&record).expect("a trace")
        };
        let first = received("m-1", "1796400000123");
        assert_eq!(first, received("m-1", "1796400000123"));
        assert_ne!(
            first.trace_id(),
            received("m-2", "1796400000123").trace_id()
        );
        assert!(format!("{:032x}", first.trace_id()).starts_with("6b12e380"));
        assert!(is_deferred(first.trace_flags()) && first.is_remote());
        assert_eq!(
            of_message(&record_with(None)),
            None,
            "no id: a trace of its own"
        );
    }

    #[test]
    fn an_open_decision_is_made_by_the_trace_id_and_a_made_one_stands() {
        let open = span_context_from_str(&PRODUCER.replace("Sampled=1", "Sampled=?"));
        let open = open.expect("a header");
        let mut ids = (0..200_u128)
            .map(|n| TraceId::from(n.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)));
        let kept = |share: f64, id: TraceId| {
            SHARE.store(share.to_bits(), Ordering::Relaxed);
            let remote = SpanContext::new(
                id,
                open.span_id(),
                open.trace_flags(),
                true,
                TraceState::default(),
            );
            decided(remote).is_sampled()
        };
        assert!(ids.clone().all(|id| kept(1.0, id)));
        assert!(!ids.clone().any(|id| kept(0.0, id)));
        let half = ids.by_ref().filter(|id| kept(0.5, *id)).count();
        assert!((60..140).contains(&half), "{half} of 200 at one half");
        let declined = span_context_from_str(&PRODUCER.replace("Sampled=1", "Sampled=0"));
        assert!(!decided(declined.expect("a header")).is_sampled());
    }

    #[test]
    fn a_header_without_a_decision_is_deferred() {
        let asked = PRODUCER.replace("Sampled=1", "Sampled=?");
        let deferred = span_context_from_str(&asked).expect("a header");
        assert!(is_deferred(deferred.trace_flags()));
        let decided = span_context_from_str(PRODUCER).expect("a header");
        assert!(!is_deferred(decided.trace_flags()));
    }
}
