//! What happens to a record once the gate answers: it is fetched, it fails without a
//! request, or it waits for its host. A wait is either a parked copy or a hold through the
//! visibility timeout. This file also sets how long a wait may last. The politeness rules
//! the worker follows live here, next to the gate.

use std::time::Duration;

use crate::ports::queue::{SQS_MAX_DELAY, SQS_MAX_VISIBILITY};
use crate::scraper::FetchError;

use super::{Entry, HoldReason, Later, Permit};

/// The failure reason of a task whose URL robots.txt forbids.
pub const DISALLOWED: &str = "disallowed by robots.txt";

/// The reason a task's try ends with when our proxy cannot fetch its host's robots.txt. It
/// counts as our failure, not the task's.
pub const ROBOTS_PROXY_FAILED: &str =
    "the host's robots.txt could not be fetched through the proxy";

/// The reason a task fails with once it waited `POLITE_MAX_WAIT_MS` for its host.
pub const WAITED_TOO_LONG: &str = "waited too long for its host";

/// The longest wait held through the visibility timeout. SQS allows 12 hours from the
/// receive; this keeps back an hour for the time the invocation may already have used.
pub const MAX_POLITE_HOLD: Duration = SQS_MAX_VISIBILITY.saturating_sub(Duration::from_secs(3_600));

/// What a record has waited for its host so far.
#[derive(Debug, Clone, Copy)]
pub struct Waited {
    /// How many waits earlier copies of its message had.
    pub waits: u32,
    /// How much longer it may wait (`POLITE_MAX_WAIT_MS` from its first wait).
    pub wait_left: Duration,
    /// The task's tries were used up by failures on our side, so it no longer waits for its
    /// host.
    pub spent: bool,
}

/// What the gate's answer makes of a record.
#[derive(Debug)]
pub enum Admission {
    /// Fetch, with the host's permit.
    Go(Permit),
    /// Fail without a request: robots.txt forbids the URL, our proxy could not fetch
    /// robots.txt, or the record waited too long.
    Refused(FetchError),
    /// Come back later, at the start booked for it if one was.
    Wait(Later),
    /// The task's tries are used up. The record is held back instead of parked, so its
    /// receives move it to the dead-letter queue.
    HeldBack,
}

/// What happens to a record, given the gate's `entry` and how long it has `waited` so far.
pub fn admission(entry: Entry, waited: Waited) -> Admission {
    let (delay, booked) = match entry {
        Entry::Go(permit) => return Admission::Go(permit),
        Entry::Disallowed => return Admission::Refused(FetchError::permanent(DISALLOWED)),
        Entry::ProxyFailed => {
            let reason = ROBOTS_PROXY_FAILED.to_owned();
            return Admission::Refused(FetchError::ours(reason));
        }
        Entry::Hold(delay, why) => {
            let delay = backed_off(delay, why, waited.waits);
            let delay_ms = delay.as_millis() as u64;
            tracing::info!(delay_ms, ?why, "the host has no room");
            (delay, None)
        }
        Entry::Booked { start, delay } => {
            let delay_ms = delay.as_millis() as u64;
            tracing::info!(delay_ms, start, "the host's start booked");
            (delay, Some(start))
        }
    };
    if waited.spent {
        return Admission::HeldBack;
    }
    if delay <= waited.wait_left {
        return Admission::Wait(Later { delay, booked });
    }
    // A wait past the limit fails the task only once it has waited all it may. Until then
    // it waits out what is left, with nothing booked, and asks again.
    if waited.wait_left < LAST_WAIT {
        return Admission::Refused(FetchError::permanent(WAITED_TOO_LONG));
    }
    Admission::Wait(Later {
        delay: waited.wait_left,
        booked: None,
    })
}

/// Less wait left than this is none: the record fails instead of coming back once more.
/// SQS delays are whole seconds.
const LAST_WAIT: Duration = Duration::from_secs(1);

/// A wait for robots.txt (being fetched by another sandbox, or unavailable) grows with the
/// copy's waits after the first few. So a host whose robots.txt never answers costs one copy
/// per task every 15 minutes, not every minute. A wait for the host's schedule, slots or
/// cooldown is used as the host gives it.
fn backed_off(delay: Duration, why: HoldReason, waits: u32) -> Duration {
    match why {
        HoldReason::Robots => {
            let backoff = Duration::from_secs(1 << waits.saturating_sub(4).min(10));
            delay.max(backoff).min(SQS_MAX_DELAY)
        }
        HoldReason::Host => delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waited(wait_left_ms: u64) -> Waited {
        Waited {
            waits: 0,
            wait_left: Duration::from_millis(wait_left_ms),
            spent: false,
        }
    }

    fn host_hold(ms: u64) -> Entry {
        Entry::Hold(Duration::from_millis(ms), HoldReason::Host)
    }

    #[test]
    fn a_wait_past_the_limit_is_waited_out_first_and_fails_only_with_no_wait_left() {
        // Arrange: the host's schedule is 75 s ahead; the limit is 60 s.
        let first_sight = waited(60_000);
        let came_back = waited(400);

        // Act
        let first = admission(host_hold(75_000), first_sight);
        let last = admission(host_hold(15_000), came_back);

        // Assert
        let Admission::Wait(later) = first else {
            panic!("a task that has not waited does not fail: {first:?}");
        };
        assert_eq!(
            later.delay,
            Duration::from_secs(60),
            "what is left of its wait"
        );
        assert_eq!(later.booked, None);
        let Admission::Refused(failed) = last else {
            panic!("no wait left: {last:?}");
        };
        assert_eq!(failed.reason, WAITED_TOO_LONG);
    }

    #[test]
    fn a_wait_within_the_limit_keeps_its_booking() {
        let booked = Entry::Booked {
            start: 9_000,
            delay: Duration::from_secs(7),
        };

        let Admission::Wait(later) = admission(booked, waited(60_000)) else {
            panic!("within the limit");
        };

        assert_eq!(later.booked, Some(9_000));
        assert_eq!(later.delay, Duration::from_secs(7));
    }
}
