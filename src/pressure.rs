//! The sandbox's record concurrency under AWS push-back: additive increase, multiplicative
//! decrease (AIMD), so a throttled fleet offers the hot table or prefix less work instead of
//! pressing on (every retried record claims again, and claims eat the write units that the
//! terminal writes need).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::contract::Outcome;

/// At most one halving per this long: a burst of throttled records from one moment halves
/// the limit once, as AIMD halves once per round trip.
const CUT_EVERY: Duration = Duration::from_secs(1);

/// How many records of this sandbox may work at once, shared by its invocations.
#[derive(Debug, Default)]
pub struct Pressure {
    state: Mutex<State>,
    turn: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// `None` until AWS pushes back (and again once the limit has grown back past
    /// `ceiling`): only the batch's own concurrency bounds the records.
    limit: Option<f64>,
    /// The records at work when the limit was first cut.
    ceiling: f64,
    in_flight: usize,
    last_cut: Option<Instant>,
}

/// A record's turn; given back when dropped.
#[derive(Debug)]
pub struct Turn<'a>(&'a Pressure);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.state().in_flight -= 1;
        self.0.turn.notify_waiters();
    }
}

impl Pressure {
    /// Waits until one more record may work.
    pub async fn admit(&self) -> Turn<'_> {
        loop {
            let turn = self.turn.notified();
            {
                let mut state = self.state();
                let room = state
                    .limit
                    .is_none_or(|l| (state.in_flight as f64) < l.floor());
                if room {
                    state.in_flight += 1;
                    return Turn(self);
                }
            }
            turn.await;
        }
    }

    /// What a record's end says of AWS: pushed back (throttled, failed, timed out) halves the
    /// limit (at most once a second); a record that got its writes through adds one
    /// record's worth over the limit (`1 / limit`); anything else says nothing.
    pub fn learn(&self, outcome: &Outcome) {
        self.learn_at(outcome, Instant::now());
    }

    fn learn_at(&self, outcome: &Outcome, now: Instant) {
        match signal(outcome) {
            Some(true) => self.cut(now),
            Some(false) => self.grow(),
            None => {}
        }
    }

    /// The records that may work at once now (`None`: no limit of its own).
    pub fn limit(&self) -> Option<usize> {
        self.state().limit.map(|l| l.floor() as usize)
    }

    fn cut(&self, now: Instant) {
        let mut state = self.state();
        if state
            .last_cut
            .is_some_and(|at| now.duration_since(at) < CUT_EVERY)
        {
            return;
        }
        let current = match state.limit {
            Some(limit) => limit,
            None => {
                state.ceiling = state.in_flight.max(1) as f64;
                state.ceiling
            }
        };
        let limit = (current / 2.0).max(1.0);
        state.limit = Some(limit);
        state.last_cut = Some(now);
        tracing::warn!(limit, "AWS pushed back: fewer records at once");
    }

    fn grow(&self) {
        let mut state = self.state();
        let Some(limit) = state.limit else {
            return;
        };
        let grown = limit + 1.0 / limit;
        state.limit = (grown < state.ceiling).then_some(grown);
        drop(state);
        self.turn.notify_waiters();
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still whole numbers.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether an outcome is AWS pushing back (`true`), a record's writes getting through
/// (`false`), or neither.
fn signal(outcome: &Outcome) -> Option<bool> {
    match outcome {
        Outcome::Store(err) => err.aws_fault().map(|fault| fault.is_push_back()),
        Outcome::Succeeded { .. }
        | Outcome::FailedPermanently { .. }
        | Outcome::GaveUp { .. }
        | Outcome::LostRace => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::ports::error::{AwsError, AwsFault};

    fn throttled() -> Outcome {
        Outcome::Store(AwsError::aws(
            "UpdateItem",
            AwsFault::Throttled,
            "slow down",
        ))
    }

    fn succeeded() -> Outcome {
        Outcome::Succeeded {
            redelivery: false,
            adopted: false,
        }
    }

    #[tokio::test]
    async fn a_push_back_halves_the_records_at_once_and_successes_grow_them_back_by_one() {
        let pressure = Pressure::default();
        let turns: Vec<_> = futures_util::future::join_all((0..16).map(|_| pressure.admit())).await;
        let now = Instant::now();

        pressure.learn_at(&throttled(), now);
        pressure.learn_at(&throttled(), now); // the same moment: one halving
        assert_eq!(pressure.limit(), Some(8));
        pressure.learn_at(&throttled(), now + CUT_EVERY);
        assert_eq!(pressure.limit(), Some(4));
        for _ in 0..5 {
            pressure.learn(&succeeded());
        }
        assert_eq!(
            pressure.limit(),
            Some(5),
            "one more after about a limit's worth"
        );
        drop(turns);
        for _ in 0..200 {
            pressure.learn(&succeeded());
        }
        assert_eq!(
            pressure.limit(),
            None,
            "back past where it was cut: no limit"
        );
    }

    #[tokio::test]
    async fn no_more_records_work_at_once_than_the_limit() {
        let pressure = Arc::new(Pressure::default());
        let first: Vec<_> = futures_util::future::join_all((0..8).map(|_| pressure.admit())).await;
        pressure.learn(&throttled());
        drop(first);
        let (busy, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let records = (0..20).map(|_| {
            let (pressure, busy, most) = (pressure.clone(), busy.clone(), most.clone());
            tokio::spawn(async move {
                let _turn = pressure.admit().await;
                let now = busy.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                busy.fetch_sub(1, Ordering::SeqCst);
            })
        });
        for record in records.collect::<Vec<_>>() {
            record.await.expect("the record ran");
        }

        assert_eq!(pressure.limit(), Some(4));
        let most = most.load(Ordering::SeqCst);
        assert!((1..=4).contains(&most), "{most} at once");
    }
}
