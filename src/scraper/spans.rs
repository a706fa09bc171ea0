//! A fetch's spans: one `hop` span per request and its redirects, on one proxy tier (0 when
//! direct), with the status, the time to the first byte, the body's time and its bytes.

use std::time::Duration;

use tracing::{Span, field};

use crate::domain::model::Page;
use crate::scraper::{FetchError, Retry};
use crate::trace::{self, STEP};

/// The span of one request (and its redirects) through `tier`.
pub(super) fn hop(tier: usize) -> Span {
    tracing::info_span!(
        target: STEP,
        "hop",
        tier = tier as i64,
        status = field::Empty,
        first_byte_ms = field::Empty,
        body_ms = field::Empty,
        bytes = field::Empty,
        blocked = field::Empty,
    )
}

/// The hop's first answer arrived, `took` after its request started (connecting included,
/// on a new connection). Recorded once: a span's attribute recorded twice is sent twice.
pub(super) fn first_answer(took: Duration) {
    Span::current().record("first_byte_ms", millis(took));
}

/// The body was read: `bytes` of it in `took`.
pub(super) fn body_read(bytes: usize, took: Duration) {
    let span = Span::current();
    span.record("bytes", i64::try_from(bytes).unwrap_or(i64::MAX));
    span.record("body_ms", millis(took));
}

/// How the hop ended: its last status. A failure is marked on its span as the ack
/// contract classifies it.
pub(super) fn ended(span: &Span, page: &Result<Page, FetchError>) {
    let err = match page {
        Ok(page) => {
            span.record("status", i64::from(page.http_status));
            return;
        }
        Err(err) => err,
    };
    span.record("blocked", err.block.is_some());
    if let Some(status) = err.http_status {
        span.record("status", i64::from(status));
    }
    let (class, reply) = match err.retry {
        Retry::Permanent => ("failed_permanently", "ack"),
        Retry::Transient | Retry::Ours => ("scrape_transient", "retry"),
    };
    span.in_scope(|| trace::failed(class, reply));
}

/// Whole milliseconds. Numbers go to spans as i64: OpenTelemetry has no unsigned integers.
fn millis(took: Duration) -> i64 {
    i64::try_from(took.as_millis()).unwrap_or(i64::MAX)
}
