//! A fetch that produced no page. It records whether the fetch is worth another delivery,
//! a short reason (for the task's `error`), what the site said (status, `Retry-After`),
//! whether the next proxy tier may get past where this one was blocked, and what the failure
//! says about the site's health.

use std::time::Duration;

use url::Url;

use crate::domain::blocks::{BLOCK_STATUSES, Block, Detection};
use crate::domain::health::Sign;

/// Whether a failed fetch is worth another delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The site's transient failure: retried, and on the final attempt the task fails.
    Transient,
    /// The page can never be had: the task fails.
    Permanent,
    /// Our failure (a proxy's credentials, gateway or tunnel), not the page's. It is retried,
    /// and never fails the task, even on the final attempt.
    Ours,
}

/// A fetch that produced no page. `reason` is short and goes on the task as `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct FetchError {
    pub retry: Retry,
    pub reason: String,
    /// The response's status, when there was a response.
    pub http_status: Option<u16>,
    /// How long the site asked us to wait (`Retry-After`), when it did.
    pub retry_after: Option<Duration>,
    /// The fetch ran out of time (connect or total).
    pub timed_out: bool,
    /// Through a proxy: the tier's addresses look blocked (a 403, a 429 without
    /// `Retry-After`, a connection the proxy could not make, a block page). The next tier
    /// may get through.
    pub blocked: bool,
    /// The answer was a bot manager's block or challenge page (`domain::blocks`).
    pub block: Option<Block>,
    /// The answer was a redirect the fetch did not follow, to this URL (http or https,
    /// checked as the first URL was). The worker follows it as a request of its own.
    /// Boxed: redirects are few, and every fetch's result carries this field.
    pub moved_to: Option<Box<Url>>,
}

/// What a fetch's result, after `took`, says about the site's health. `None`: nothing,
/// because it was our failure or our own refusal before any request.
pub fn health_sign<T>(result: &Result<T, FetchError>, took: Duration) -> Option<Sign> {
    let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    let Err(error) = result else {
        return Some(Sign::Answered(ms));
    };
    let retry_after = || {
        error
            .retry_after
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    match (error.retry, error.http_status) {
        (Retry::Ours, _) => None,
        (_, Some(429 | 503)) => Some(Sign::PushedBack(retry_after())),
        (_, Some(500..=599)) => Some(Sign::Failing),
        (_, Some(_)) => Some(Sign::Answered(ms)),
        (Retry::Transient, None) => Some(Sign::Failing),
        (Retry::Permanent, None) => None,
    }
}

impl FetchError {
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self::new(Retry::Permanent, reason)
    }

    pub fn transient(reason: impl Into<String>) -> Self {
        Self::new(Retry::Transient, reason)
    }

    pub fn ours(reason: impl Into<String>) -> Self {
        Self::new(Retry::Ours, reason)
    }

    pub(super) fn new(retry: Retry, reason: impl Into<String>) -> Self {
        Self {
            retry,
            reason: reason.into(),
            http_status: None,
            retry_after: None,
            timed_out: false,
            blocked: false,
            block: None,
            moved_to: None,
        }
    }

    /// Why a response of `http_status` is not a page (`classify_status`); `None` for a 2xx.
    pub fn of_status(http_status: u16) -> Option<Self> {
        let status = reqwest::StatusCode::from_u16(http_status).ok()?;
        let retry = super::classify_status(status)?;
        Some(Self {
            http_status: Some(http_status),
            ..Self::new(retry, format!("HTTP {http_status}"))
        })
    }

    /// A redirect with status `http_status` to `to`, not followed by the fetch.
    pub fn moved(http_status: u16, to: Url) -> Self {
        Self {
            http_status: Some(http_status),
            moved_to: Some(Box::new(to)),
            ..Self::permanent(format!("HTTP {http_status} (redirect not followed)"))
        }
    }

    /// A response that was `block`'s block page. It is never a result. It fails for good
    /// when no other tier can be asked, and moves on to the next tier when one can.
    pub fn blocked_by(block: Block, http_status: u16) -> Self {
        let reason = block.reason();
        Self {
            http_status: Some(http_status),
            blocked: true,
            block: Some(block),
            ..Self::permanent(reason)
        }
    }
}

/// The block a refused response shows, by its headers, or, for a status bot managers answer
/// with, by the start of its body (`start`, read up to [`BODY_WINDOW`]).
pub(super) fn refusal_block(
    detection: &Detection,
    (status, content_type): (u16, Option<&str>),
    by_headers: Option<Block>,
    start: &[u8],
) -> Option<Block> {
    let by_body = || {
        BLOCK_STATUSES
            .contains(&status)
            .then(|| detection.by_body(content_type, start))
    };
    by_headers.or_else(|| by_body().flatten())
}
