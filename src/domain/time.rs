//! Time, in the formats the worker writes it.

use std::time::SystemTime;

/// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T06:01:27.123Z`.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// The time an RFC 3339 text names, in ms since the Unix epoch, if it names one.
pub fn millis_of_rfc3339(text: &str) -> Option<u64> {
    let at = humantime::parse_rfc3339_weak(text).ok()?;
    u64::try_from(epoch_millis(at)).ok()
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn epoch_millis(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// A fetch given less time than this would mostly time out, so it is not started.
pub const MIN_FETCH: std::time::Duration = std::time::Duration::from_secs(1);
