//! The sleep until a fetch's start, and the check made there. If any sandbox recorded
//! trouble for the host meanwhile, the record goes back to wait. A missed start is
//! scheduled again.

use std::time::{Duration, Instant};

use crate::domain::health;
use crate::domain::limits::{CONTENDED_RETRY_MS, Host, HostLimits, Millis};
use crate::metrics::Measures;
use crate::ports::error::StoreError;
use crate::ports::hosts::HostStore;

use super::{
    AGAIN_TIME, Entry, FRESH_GRANT_MS, Later, ORDER, Permit, Schedule, jittered,
    missed_once_checked, now_ms,
};

impl Schedule {
    /// Sleeps until the permit's start, then checks the host's item again. The check is made
    /// ahead of the start by its usual time, so the fetch starts on time. A booked start
    /// takes its slot in one write, which also checks the cooldown. Any other start reads the
    /// cooldown, unless it was granted a moment ago. If the host got into trouble since (from
    /// any sandbox's fetch), or the slot is still taken, the permit is given back and the
    /// wait is returned. If the start was missed, or was given before the pace dropped, the
    /// schedule is asked again, with the fetch time left until `ends`.
    pub async fn ready<S: HostStore>(
        &self,
        store: &S,
        mut permit: Permit,
        ends: Instant,
        measures: &Measures,
    ) -> Result<Result<Permit, Later>, StoreError> {
        let Some((host, max_rps)) = permit.host.clone() else {
            return Ok(Ok(permit));
        };
        let lead = self.check.lead();
        sleep_until(permit.start.saturating_sub(lead), measures).await;
        let asked = now_ms();
        let fresh = asked.max(permit.start) <= permit.given_at + FRESH_GRANT_MS;
        if fresh && permit.at_start.is_none() {
            sleep_until(permit.start, measures).await;
            return Ok(Ok(permit));
        }
        if let Err(wait) = self.at_start(store, &host, &mut permit).await? {
            self.leave(store, permit, None, measures).await;
            return Ok(Err(Later::after(wait)));
        }
        self.check.learn(now_ms().saturating_sub(asked));
        sleep_until(permit.start, measures).await;
        let now = now_ms();
        let pace = (max_rps, self.view(&host).slowdown_at(now));
        let missed = missed_once_checked(permit.start, pace, (asked + lead, now));
        let view = self.view(&host);
        let void =
            health::voided(&view, permit.given_at) || view.gave_back(permit.start, permit.given_at);
        if missed || void {
            let fetch_time = AGAIN_TIME.min(ends.saturating_duration_since(Instant::now()));
            let again = self.again(store, permit, (&host, max_rps), fetch_time, measures);
            return again.await;
        }
        Ok(Ok(permit))
    }

    /// A missed start (the claim or the check took too long) would bunch up with the next
    /// ones. A start given before the pace dropped would go at the old pace. So the schedule
    /// is asked again, once. A start is booked if the schedule is full past the sleep.
    async fn again<S: HostStore>(
        &self,
        store: &S,
        permit: Permit,
        (host, max_rps): (&Host, Option<f64>),
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<Result<Permit, Later>, StoreError> {
        let schedule = HostLimits {
            max_rps,
            max_inflight: None,
        };
        let booking = (permit.far, permit.booker.as_ref());
        match self
            .take(store, host, schedule, fetch_time, booking)
            .await?
        {
            Entry::Go(again) => {
                let permit = Permit {
                    start: again.start,
                    given_at: again.given_at,
                    ..permit
                };
                self.checked_again(store, host, permit, measures).await
            }
            Entry::Hold(delay, _) => {
                self.leave(store, permit, None, measures).await;
                Ok(Err(Later::after(delay)))
            }
            Entry::Booked { start, delay } => {
                self.leave(store, permit, None, measures).await;
                let booked = Some(start);
                Ok(Err(Later { delay, booked }))
            }
            Entry::Disallowed | Entry::ProxyFailed => Ok(Ok(permit)),
        }
    }

    /// A start taken again is checked like any other. If it was given more than a moment
    /// before the start, the host's item is read at the start. Trouble recorded since (a
    /// cooldown, or a drop in pace that voids the start) sends the record back to wait, not
    /// to ask a third time.
    async fn checked_again<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        mut permit: Permit,
        measures: &Measures,
    ) -> Result<Result<Permit, Later>, StoreError> {
        if permit.start > permit.given_at + FRESH_GRANT_MS {
            sleep_until(permit.start.saturating_sub(self.check.lead()), measures).await;
            let checked = match self.at_start(store, host, &mut permit).await? {
                Err(wait) => Err(wait),
                Ok(()) if health::voided(&self.view(host), permit.given_at) => {
                    Err(jittered(CONTENDED_RETRY_MS))
                }
                Ok(()) => Ok(()),
            };
            if let Err(wait) = checked {
                self.leave(store, permit, None, measures).await;
                return Ok(Err(Later::after(wait)));
            }
        }
        sleep_until(permit.start, measures).await;
        Ok(Ok(permit))
    }

    /// The check at the start. A booked start with an in-flight limit takes its slot; that
    /// write also checks the cooldown. Otherwise the host's item is read and kept as this
    /// sandbox's view. `Err`: how long to wait instead.
    pub(super) async fn at_start<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        permit: &mut Permit,
    ) -> Result<Result<(), Duration>, StoreError> {
        let now = now_ms();
        if let Some((limits, fetch_time)) = permit.at_start.take()
            && limits.max_inflight.is_some()
        {
            let slot_only = HostLimits {
                max_rps: None,
                ..limits
            };
            return Ok(
                match self
                    .take(store, host, slot_only, fetch_time, (None, None))
                    .await?
                {
                    Entry::Go(taken) => {
                        permit.slot = taken.slot;
                        Ok(())
                    }
                    Entry::Hold(wait, _) | Entry::Booked { delay: wait, .. } => Err(wait),
                    Entry::Disallowed | Entry::ProxyFailed => Ok(()),
                },
            );
        }
        let state = store.host(host).await?;
        let cooldown = state.cooldown_until;
        self.remember(host, state);
        Ok(match cooldown.filter(|until| *until > now) {
            Some(until) => Err(jittered(until - now)),
            None => Ok(()),
        })
    }
}

/// Sleeps until `at` (ms since the epoch). The time counts as politeness sleep in the
/// metrics.
async fn sleep_until(at: Millis, measures: &Measures) {
    let wait = at.saturating_sub(now_ms());
    measures.polite.slept_ms.fetch_add(wait, ORDER);
    tokio::time::sleep(Duration::from_millis(wait)).await;
}
