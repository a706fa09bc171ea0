//! Time, in the formats the worker writes it.

use std::time::SystemTime;

/// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-30T06:01:27.123Z`.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn epoch_millis(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// A fetch given less time than this would mostly time out, so it is not started.
pub const MIN_FETCH: std::time::Duration = std::time::Duration::from_secs(1);
