//! Retry timing: how long a message is held back in SQS before it is redelivered. It is as
//! long as the site asked (`Retry-After`), or else an exponential backoff with full jitter.

use std::time::Duration;

use crate::ports::queue::SQS_MAX_VISIBILITY;

/// How long to hold a message back before its next delivery.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The upper bound of the first retry's delay. It doubles with every receive.
    pub base: Duration,
    /// No hold is longer, whatever the site asks (and never longer than 12 hours).
    pub max: Duration,
    /// A number in [0, 1]: `fastrand::f64` in production ("full jitter").
    pub jitter: fn() -> f64,
}

impl Backoff {
    /// `Retry-After` when the site sent it, else a random time up to `base * 2^(receives-1)`;
    /// both capped by `max` and SQS's 12 hours.
    pub fn delay(&self, retry_after: Option<Duration>, receive_count: u32) -> Duration {
        match retry_after {
            Some(asked) => asked.min(self.cap()),
            None => self.ceiling(receive_count).mul_f64(self.jitter()),
        }
    }

    /// A hold for when an AWS resource pushed back (throttled, failed or timed out). It uses
    /// the same doubling ceiling, capped at `strain` times the base. `strain` is how far the
    /// sandbox's pressure has cut its concurrency, so a record is held long only while the
    /// load is still being cut, not once it has eased. The hold is jittered in the upper half
    /// of its ceiling ("equal jitter"), so held records come back spread out and none at
    /// once. No hold is shorter than half its ceiling.
    pub fn pressed(&self, receive_count: u32, strain: f64) -> Duration {
        let strained = self.base.mul_f64(strain.clamp(1.0, 1e6));
        self.ceiling(receive_count)
            .min(strained)
            .mul_f64(0.5 + self.jitter() / 2.0)
    }

    /// `base * 2^(receives-1)`, capped.
    fn ceiling(&self, receive_count: u32) -> Duration {
        let doublings = receive_count.saturating_sub(1).min(30);
        self.base.saturating_mul(1 << doublings).min(self.cap())
    }

    fn cap(&self) -> Duration {
        self.max.min(SQS_MAX_VISIBILITY)
    }

    fn jitter(&self) -> f64 {
        (self.jitter)().clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(jitter: fn() -> f64) -> Backoff {
        Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(900),
            jitter,
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let b = backoff(|| 0.5);
        assert_eq!(
            b.delay(Some(Duration::from_secs(2)), 1),
            Duration::from_secs(2)
        );
        assert_eq!(
            b.delay(Some(Duration::from_secs(3600)), 1),
            Duration::from_secs(900)
        );
        let unbounded = Backoff {
            max: Duration::from_secs(100_000),
            ..b
        };
        assert_eq!(
            unbounded.delay(Some(Duration::from_secs(90_000)), 1),
            SQS_MAX_VISIBILITY
        );
    }

    #[test]
    fn without_retry_after_the_ceiling_doubles_per_receive_up_to_the_cap() {
        let highest = backoff(|| 1.0);
        let ceilings: Vec<u64> = (1..=10).map(|n| highest.delay(None, n).as_secs()).collect();
        assert_eq!(ceilings, [5, 10, 20, 40, 80, 160, 320, 640, 900, 900]);
        assert_eq!(highest.delay(None, u32::MAX), Duration::from_secs(900));
        assert_eq!(highest.delay(None, 0), Duration::from_secs(5));
    }

    #[test]
    fn a_pressed_hold_grows_with_the_receives_and_is_never_under_half_its_ceiling() {
        let strained = 1e6;
        let lowest = backoff(|| 0.0).pressed(4, strained);
        let highest = backoff(|| 1.0).pressed(4, strained);
        assert_eq!(
            (lowest, highest),
            (Duration::from_secs(20), Duration::from_secs(40))
        );
        assert_eq!(
            backoff(|| 0.0).pressed(1, strained),
            Duration::from_millis(2500)
        );
        assert_eq!(
            backoff(|| 1.0).pressed(20, strained),
            Duration::from_secs(900)
        );
    }

    #[test]
    fn a_pressed_hold_is_no_longer_than_the_sandboxs_strain_allows() {
        let highest = backoff(|| 1.0);

        // The tenth receive's ceiling is 900 s; a sandbox at 4x under its records holds 20 s.
        assert_eq!(highest.pressed(10, 4.0), Duration::from_secs(20));
        assert_eq!(highest.pressed(10, 1.0), Duration::from_secs(5));
        assert_eq!(
            highest.pressed(2, 160.0),
            Duration::from_secs(10),
            "the receives' own"
        );
        assert_eq!(
            highest.pressed(10, 0.0),
            Duration::from_secs(5),
            "never under the base"
        );
    }

    #[test]
    fn full_jitter_spreads_between_zero_and_the_ceiling() {
        assert_eq!(backoff(|| 0.0).delay(None, 4), Duration::ZERO);
        assert_eq!(backoff(|| 0.25).delay(None, 4), Duration::from_secs(10));
        let random = Backoff::from(
            &crate::Config::from_lookup(|name| match name {
                "TABLE_NAME" | "RESULTS_BUCKET" => Some("x".into()),
                _ => None,
            })
            .unwrap(),
        );
        for _ in 0..100 {
            assert!(random.delay(None, 3) <= Duration::from_secs(20));
        }
    }
}
