//! Retrying writes inside the invocation. A write that met a concurrent change to the same
//! item is tried again a bounded number of times, with jittered pauses, and never past the
//! cutoff. The terminal write is retried the same way when it is still throttled after the
//! SDK's own attempts.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::ports::error::{StoreError, StoreFault};

/// How often, and how far apart, a write that met a conflict is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all, the first one included.
    pub attempts: u32,
    /// The upper bound of the first pause. It doubles with every conflict, up to `max_pause`.
    pub base: Duration,
    pub max_pause: Duration,
}

impl Default for RetryPolicy {
    /// Six tries, over about a second and a half at most. DynamoDB transactions take tens of
    /// milliseconds, so a conflict that lasts longer than this is contention, not bad luck.
    fn default() -> Self {
        Self {
            attempts: 6,
            base: Duration::from_millis(25),
            max_pause: Duration::from_millis(800),
        }
    }
}

/// When the terminal write is still throttled after the SDK's own three attempts, the record
/// tries it again itself: four rounds in all, with pauses of up to 4, 8 and 8 s. The record
/// has already done its work (claimed, fetched, stored). Held back instead, it would claim
/// again and spend the write units the terminal writes are short of. It waits while keeping
/// its place in the sandbox's concurrency limit, which also eases the load on the table.
pub const FINISH_THROTTLED: RetryPolicy = RetryPolicy {
    attempts: 4,
    base: Duration::from_secs(4),
    max_pause: Duration::from_secs(8),
};

/// How long a write keeps retrying conflicts, within one invocation (or one operator
/// routine).
#[derive(Debug, Clone, Copy)]
pub struct Patience<'a> {
    /// No try starts after this instant (the batch's cutoff).
    pub until: Instant,
    pub policy: RetryPolicy,
    /// Counts every conflict met (for the invocation's metrics).
    pub conflicts: &'a AtomicU64,
}

impl<'a> Patience<'a> {
    pub fn new(until: Instant, policy: RetryPolicy, conflicts: &'a AtomicU64) -> Self {
        Self {
            until,
            policy,
            conflicts,
        }
    }

    /// Runs `write` until it ends without a conflict, the tries are used up, or the next
    /// pause would end past `until`. If it gives up, the last conflict is returned.
    pub async fn retry<T, F, Fut>(&self, write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        self.retry_while(write, None).await
    }

    /// Like [`Patience::retry`], but also retries while the write is throttled. `throttled`
    /// sets those retries: each try is a round of the SDK's own attempts, with pauses between
    /// rounds.
    pub async fn retry_throttled<T, F, Fut>(
        &self,
        write: F,
        throttled: RetryPolicy,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        self.retry_while(write, Some(throttled)).await
    }

    async fn retry_while<T, F, Fut>(
        &self,
        mut write: F,
        throttled: Option<RetryPolicy>,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let (mut conflicts, mut throttles) = (0, 0);
        loop {
            let err = match write().await {
                Err(err) => err,
                done => return done,
            };
            let (policy, tried) = match throttled {
                _ if err.is_conflict() => {
                    self.conflicts.fetch_add(1, Ordering::Relaxed);
                    conflicts += 1;
                    (self.policy, conflicts)
                }
                Some(policy) if err.fault() == Some(&StoreFault::Throttled) => {
                    throttles += 1;
                    (policy, throttles)
                }
                _ => return Err(err),
            };
            let pause = pause(policy, tried);
            if tried >= policy.attempts || Instant::now() + pause >= self.until {
                tracing::warn!(tries = tried, error = %err, "the write did not get through");
                return Err(err);
            }
            tracing::debug!(tries = tried, pause_ms = pause.as_millis() as u64, error = %err, "trying the write again");
            tokio::time::sleep(pause).await;
        }
    }
}

/// Full jitter: a random pause up to `base * 2^(tried-1)`, capped.
fn pause(policy: RetryPolicy, tried: u32) -> Duration {
    let RetryPolicy {
        base, max_pause, ..
    } = policy;
    let ceiling = base
        .saturating_mul(1 << tried.saturating_sub(1).min(16))
        .min(max_pause);
    ceiling.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn conflict() -> StoreError {
        StoreError::Changed {
            detail: "another transaction".into(),
        }
    }

    fn patience(attempts: u32, within: Duration, conflicts: &AtomicU64) -> Patience<'_> {
        let policy = RetryPolicy {
            attempts,
            base: Duration::from_millis(2),
            max_pause: Duration::from_millis(4),
        };
        Patience::new(Instant::now() + within, policy, conflicts)
    }

    #[tokio::test]
    async fn a_conflict_that_clears_is_tried_again_until_it_succeeds() {
        let (calls, met) = (Cell::new(0), AtomicU64::new(0));

        let result = patience(6, Duration::from_secs(5), &met)
            .retry(|| {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 3 { Err(conflict()) } else { Ok(n) } }
            })
            .await;

        assert_eq!(result.unwrap(), 3);
        assert_eq!(met.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_persisting_conflict_gives_up_after_the_attempts() {
        let calls = Cell::new(0);

        let result: Result<(), _> = patience(4, Duration::from_secs(5), &AtomicU64::new(0))
            .retry(|| {
                calls.set(calls.get() + 1);
                async { Err(conflict()) }
            })
            .await;

        assert!(result.unwrap_err().is_conflict());
        assert_eq!(calls.get(), 4);
    }

    #[tokio::test]
    async fn no_try_starts_past_the_cutoff() {
        let calls = Cell::new(0);

        let result: Result<(), _> = patience(100, Duration::ZERO, &AtomicU64::new(0))
            .retry(|| {
                calls.set(calls.get() + 1);
                async { Err(conflict()) }
            })
            .await;

        assert!(result.is_err());
        assert_eq!(calls.get(), 1);
    }

    #[tokio::test]
    async fn other_errors_are_not_tried_again() {
        let calls = Cell::new(0);

        let result: Result<(), _> = patience(6, Duration::from_secs(5), &AtomicU64::new(0))
            .retry(|| {
                calls.set(calls.get() + 1);
                async {
                    Err(StoreError::Corrupt {
                        what: "task",
                        detail: "status 7".into(),
                    })
                }
            })
            .await;

        assert!(result.is_err());
        assert_eq!(calls.get(), 1);
    }

    fn throttled() -> StoreError {
        StoreError::failed("TransactWriteItems", StoreFault::Throttled, "slow down")
    }

    const ROUNDS: RetryPolicy = RetryPolicy {
        attempts: 4,
        base: Duration::from_millis(2),
        max_pause: Duration::from_millis(4),
    };

    #[tokio::test]
    async fn a_throttled_terminal_write_is_tried_again_in_rounds_then_given_up() {
        let (calls, met) = (Cell::new(0), AtomicU64::new(0));

        let result: Result<(), _> = patience(6, Duration::from_secs(5), &met)
            .retry_throttled(
                || {
                    calls.set(calls.get() + 1);
                    async { Err(throttled()) }
                },
                ROUNDS,
            )
            .await;

        assert_eq!(result.unwrap_err().fault(), Some(&StoreFault::Throttled));
        assert_eq!(calls.get(), 4, "the rounds in all");
        assert_eq!(met.load(Ordering::Relaxed), 0, "no conflict counted");
    }

    #[tokio::test]
    async fn throttling_that_eases_lets_the_write_through_and_other_writes_are_not_kept() {
        let calls = Cell::new(0);

        let through = patience(6, Duration::from_secs(5), &AtomicU64::new(0))
            .retry_throttled(
                || {
                    calls.set(calls.get() + 1);
                    let n = calls.get();
                    async move { if n < 3 { Err(throttled()) } else { Ok(n) } }
                },
                ROUNDS,
            )
            .await;
        let plain: Result<(), _> = patience(6, Duration::from_secs(5), &AtomicU64::new(0))
            .retry(|| async { Err(throttled()) })
            .await;

        assert_eq!(through.unwrap(), 3);
        assert!(
            plain.is_err(),
            "only the terminal write waits out throttling"
        );
    }
}
