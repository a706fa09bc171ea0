//! The retry table: which responses and errors of a fetch are worth another delivery, and
//! when the site asked us to come back.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use super::policy::Refused;
use super::{FetchError, Retry};
use crate::domain::limits::MAX_RETRY_AFTER_MS;

/// How a response status is treated. Transient: Scrapy's retry list (408, 429, 500, 502,
/// 503, 504, 522, 524), widened here to every 5xx, plus 425 Too Early. Everything else that
/// is not 2xx is permanent.
pub fn classify_status(status: StatusCode) -> Option<Retry> {
    match status.as_u16() {
        200..=299 => None,
        408 | 425 | 429 => Some(Retry::Transient),
        500..=599 => Some(Retry::Transient),
        _ => Some(Retry::Permanent),
    }
}

/// How a failed request is treated, by reqwest's error kind and our own typed causes:
///
/// | cause | retry |
/// |---|---|
/// | refused by the address policy, too many redirects | permanent ([`Refused::failure`]) |
/// | a request reqwest cannot build, a redirect it cannot follow | permanent |
/// | timeout (connect or total) | transient |
/// | connect failed (refused, unreachable, TLS) | transient |
/// | anything else while sending or reading (reset, closed, malformed) | transient |
pub fn classify_error(err: &reqwest::Error) -> FetchError {
    if let Some(refused) = find_cause::<Refused>(err) {
        return refused.failure();
    }
    let cause = root_cause(err);
    if err.is_timeout() {
        FetchError {
            timed_out: true,
            ..FetchError::transient("timed out")
        }
    } else if err.is_builder() || err.is_redirect() {
        FetchError::permanent(format!("request refused: {cause}"))
    } else if err.is_connect() {
        FetchError::transient(format!("connect failed: {cause}"))
    } else {
        FetchError::transient(format!("request failed: {cause}"))
    }
}

/// `Retry-After` as a delay from `now`: delta-seconds or an HTTP date (RFC 9110 10.2.3). It
/// is capped at [`MAX_RETRY_AFTER_MS`], and a number too large for a u64 counts as the cap.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let longest = Duration::from_millis(MAX_RETRY_AFTER_MS);
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(longest));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(longest),
    )
}

/// The first error of type `T` in `err`'s chain of sources, `err` included.
pub(super) fn find_cause<'a, T: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn statuses_follow_the_retry_table() {
        let table = [
            (200, None),
            (204, None),
            (301, Some(Retry::Permanent)),
            (304, Some(Retry::Permanent)),
            (400, Some(Retry::Permanent)),
            (401, Some(Retry::Permanent)),
            (403, Some(Retry::Permanent)),
            (404, Some(Retry::Permanent)),
            (410, Some(Retry::Permanent)),
            (451, Some(Retry::Permanent)),
            (408, Some(Retry::Transient)),
            (425, Some(Retry::Transient)),
            (429, Some(Retry::Transient)),
            (500, Some(Retry::Transient)),
            (502, Some(Retry::Transient)),
            (503, Some(Retry::Transient)),
            (504, Some(Retry::Transient)),
            (522, Some(Retry::Transient)),
            (524, Some(Retry::Transient)),
        ];
        for (code, expected) in table {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_status(status), expected, "HTTP {code}");
        }
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let at = |v: &str| retry_after(&headers(v), now);
        assert_eq!(at("120"), Some(Duration::from_secs(120)));
        assert_eq!(at(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(
            at("Wed, 21 Oct 2015 07:29:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            at("Wed, 21 Oct 2015 07:00:00 GMT"),
            Some(Duration::ZERO),
            "a past date"
        );
        assert_eq!(at("soon"), None);
        assert_eq!(at(""), None);
        assert_eq!(at("-5"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn a_huge_retry_after_is_taken_as_the_longest() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let at = |v: &str| retry_after(&headers(v), now);
        let longest = Some(Duration::from_millis(MAX_RETRY_AFTER_MS));

        assert_eq!(at("99999999999999999999"), longest, "past u64");
        assert_eq!(at("18446744073709551615"), longest, "u64::MAX seconds");
        assert_eq!(at("Fri, 31 Dec 9999 23:59:59 GMT"), longest);
        assert_eq!(at("86399"), Some(Duration::from_secs(86_399)));
    }
}
