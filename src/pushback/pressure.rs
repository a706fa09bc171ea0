//! How many records the sandbox works on at once while AWS pushes back. It uses additive
//! increase, multiplicative decrease (AIMD), so a throttled fleet sends less work to the hot
//! table or prefix instead of pressing on. Pressing on makes it worse: every retried record
//! claims again, and claims use up the write units that the terminal writes need. Below one
//! record at a time, the sandbox pauses between records. So even a fleet with more sandboxes
//! than the resource can serve still backs off.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::contract::Outcome;

/// At most one halving per this period. A burst of throttled records at one moment halves
/// the limit once, as AIMD halves once per round trip.
const CUT_EVERY: Duration = Duration::from_secs(1);
/// The lowest limit: the sandbox works 1/16 of the time, pausing fifteen times as long as
/// its last record took. Below one record at a time, each success adds this much.
pub const LEAST: f64 = 1.0 / 16.0;

/// How many records of this sandbox may work at once, shared by its invocations.
#[derive(Debug, Default)]
pub struct Pressure {
    state: Mutex<State>,
    turn: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// `None` until AWS pushes back, and again once the limit grows back past `ceiling`.
    /// While it is `None`, only the batch's own concurrency limits the records.
    limit: Option<f64>,
    /// The records at work when the limit was first cut.
    ceiling: f64,
    in_flight: usize,
    last_cut: Option<Instant>,
    /// When the limit is under one record: no record starts before this.
    resting_until: Option<Instant>,
}

impl State {
    /// Whether one more record may start `now`. If not because the sandbox pauses, until
    /// when.
    fn room(&self, now: Instant) -> Result<(), Option<Instant>> {
        match self.limit {
            None => Ok(()),
            Some(l) if l >= 1.0 && (self.in_flight as f64) < l.floor() => Ok(()),
            Some(l) if l >= 1.0 || self.in_flight > 0 => Err(None),
            Some(_) => match self.resting_until {
                Some(until) if until > now => Err(Some(until)),
                _ => Ok(()),
            },
        }
    }
}

/// A record's turn; given back when dropped.
#[derive(Debug)]
pub struct InFlight<'a> {
    pressure: &'a Pressure,
    started: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut state = self.pressure.state();
        state.in_flight -= 1;
        if let Some(l) = state.limit.filter(|l| *l < 1.0) {
            let took = now.duration_since(self.started);
            state.resting_until = Some(now + took.mul_f64(1.0 / l - 1.0));
        }
        drop(state);
        self.pressure.turn.notify_waiters();
    }
}

impl Pressure {
    /// Waits until one more record may work.
    pub async fn admit(&self) -> InFlight<'_> {
        loop {
            let turn = self.turn.notified();
            let now = Instant::now();
            let resting = {
                let mut state = self.state();
                match state.room(now) {
                    Ok(()) => {
                        state.in_flight += 1;
                        return InFlight {
                            pressure: self,
                            started: now,
                        };
                    }
                    Err(resting) => resting,
                }
            };
            match resting {
                // Woken early when the limit grows.
                Some(until) => {
                    let _ = tokio::time::timeout_at(until, turn).await;
                }
                None => turn.await,
            }
        }
    }

    /// Updates the limit from how a record ended. A push-back from AWS (throttled, failed,
    /// timed out) halves the limit, at most once a second and never below [`LEAST`]. A
    /// record that got its writes through adds `1 / limit`, so a full round of successes
    /// adds about one record (below one record, it adds `LEAST`). Any other outcome changes
    /// nothing.
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

    /// How many records may work at once now. `None`: no limit of its own. 0: fewer than
    /// one, so the sandbox pauses between records.
    pub fn limit(&self) -> Option<usize> {
        self.state().limit.map(|l| l.floor() as usize)
    }

    /// How far the limit is below the concurrency it was cut from (1: not cut; at most 16
    /// times the batch's concurrency). A pushed-back record's hold grows with it.
    pub fn strain(&self) -> f64 {
        let state = self.state();
        state.limit.map_or(1.0, |l| (state.ceiling / l).max(1.0))
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
        let limit = (current / 2.0).max(LEAST);
        state.limit = Some(limit);
        state.last_cut = Some(now);
        tracing::warn!(limit, "AWS pushed back: fewer records at once");
    }

    fn grow(&self) {
        let mut state = self.state();
        let Some(limit) = state.limit else {
            return;
        };
        let grown = match limit < 1.0 {
            true => limit + LEAST,
            false => limit + 1.0 / limit,
        };
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
        Outcome::Store(err) => err.fault().map(|fault| fault.is_push_back()),
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
    use crate::ports::error::{StoreError, StoreFault};

    fn throttled() -> Outcome {
        Outcome::Store(StoreError::failed(
            "UpdateItem",
            StoreFault::Throttled,
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

    #[tokio::test(start_paused = true)]
    async fn below_one_record_the_sandbox_rests_between_records_and_strain_grows() {
        let pressure = Pressure::default();
        let first = pressure.admit().await;
        let start = Instant::now();
        for second in 0..6 {
            // 1 record, then 1/2, 1/4, 1/8, 1/16, and no lower.
            pressure.learn_at(&throttled(), start + CUT_EVERY * second);
        }
        assert_eq!(pressure.limit(), Some(0));
        assert_eq!(
            pressure.strain(),
            16.0,
            "cut from one record to a sixteenth"
        );

        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first); // took 1 s: pauses 15 s
        let ended = Instant::now();
        let next = pressure.admit().await;

        assert_eq!(next.started.duration_since(ended), Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn a_resting_sandbox_takes_a_record_at_once_when_successes_lift_it_past_one() {
        let pressure = Arc::new(Pressure::default());
        let first = pressure.admit().await;
        let start = Instant::now();
        for second in 0..2 {
            pressure.learn_at(&throttled(), start + CUT_EVERY * second);
        }
        // Now a fraction under one: 1/4 after two halvings from a ceiling of 1 (no limit
        // again past it); a ceiling of 2 keeps the test's limit alive.
        pressure.state().ceiling = 2.0;
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        let waiting = tokio::spawn({
            let pressure = pressure.clone();
            async move { pressure.admit().await.started }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..12 {
            pressure.learn(&succeeded());
        }
        let started = waiting.await.expect("the record ran");

        assert!(
            started.duration_since(start) < Duration::from_secs(2),
            "not the 3 s rest"
        );
        assert!(pressure.strain() >= 1.0);
    }
}
