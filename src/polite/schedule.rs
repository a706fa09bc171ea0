//! The host's schedule for one fetch. A start time and a slot are asked of the host's item.
//! A sandbox's records ask one at a time and book starts together. After the fetch, the slot
//! is given back along with what the fetch showed about the host's health. The sleep until
//! the start is in `start`.

use crate::domain::health::{self, Sign, Trouble};
use crate::domain::limits::{Ask, Booker, Grant, Host, HostLimits, HostState, Millis, Slot};
use crate::metrics::Measures;
use crate::ports::error::StoreError;
use crate::ports::hosts::{HostStore, PushedBack, Taken};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{
    BOOKING_LEAD_MS, CheckTime, Entry, GIVE_BACK_PAST_MS, HoldReason, HostTurn,
    MOST_BOOKED_TOGETHER, MOST_HOSTS, ORDER, Permit, SLOT_MARGIN_MS, WANTS_WORK_KEPT_MS, jittered,
    limits, millis, now_ms,
};

/// How many times a push-back write is tried when other sandboxes' push-backs keep landing
/// between its read and its write. Each try starts from the item as the refusal returned it.
const PUSH_BACK_TRIES: usize = 4;

/// The hosts' schedules as this sandbox sees them, and what it remembers between
/// invocations: each host's view (refreshed by every answer from the host's item), whose
/// turn it is to ask, the runs read as wanting work, and how long the check at a start
/// takes here.
#[derive(Debug)]
pub struct Schedule {
    /// The longest wait for a start that is slept inside the invocation
    /// (`Politeness::max_sleep`).
    max_sleep: Duration,
    views: Mutex<HashMap<Host, HostState>>,
    turns: Mutex<HashMap<Host, Arc<HostTurn>>>,
    /// Runs read as wanting work, and when: a run that books behind one of them does not
    /// read it again for a while.
    working: Mutex<HashMap<Booker, Millis>>,
    /// How long the check at a start takes in this sandbox. The check is made that much
    /// ahead of the start.
    pub(super) check: CheckTime,
}

impl Schedule {
    pub fn new(max_sleep: Duration) -> Self {
        Self {
            max_sleep,
            views: Mutex::default(),
            turns: Mutex::default(),
            working: Mutex::default(),
            check: CheckTime::default(),
        }
    }

    /// The host's schedule and a slot for one fetch. They are asked of the host's item,
    /// unless this sandbox's view already shows a cooldown or a schedule full past the
    /// horizon (those only move later). The record then sleeps until the start. If the
    /// schedule is full past the sleep, the next start is booked if it is before `far`.
    /// With no `far`, nothing is booked. Before booking behind another run's stretch, that
    /// stretch is given back if its run no longer wants work (`gave_back_for`).
    pub(super) async fn take<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        limits: HostLimits,
        fetch_time: Duration,
        (far, booker): (Option<Millis>, Option<&Booker>),
    ) -> Result<Entry, StoreError> {
        if limits.is_none() {
            return Ok(Entry::Go(Permit::default()));
        }
        // This sandbox sends one request per host at a time, each based on the last answer,
        // so its records do not race each other for the host's item. Records that may book
        // are counted while they wait, so the one asking can book for them too.
        let turn = self.turn(host);
        let booking = usize::from(far.is_some());
        turn.waiting.fetch_add(booking, ORDER);
        let mut spare = turn.spare.lock().await;
        turn.waiting.fetch_sub(booking, ORDER);
        let ask = self.ask(&self.view(host), limits, fetch_time);
        let (mut grant, _, mut slot) = self.asked(store, host, &ask, booker).await?;
        if let (Grant::Later(_), Some(_), Some(booker)) = (grant, far, booker)
            && self.gave_back_for(store, host, booker, ask.now).await?
        {
            (grant, _, slot) = self.asked(store, host, &ask, Some(booker)).await?;
        }
        match (grant, far) {
            (Grant::Later(_), Some(far)) => {
                let unslotted = Ask { slot: None, ..ask };
                let together = (&mut *spare, turn.waiting.load(ORDER));
                self.book(store, (host, booker), unslotted, far, together)
                    .await
            }
            (grant, _) => Ok(granted((host, limits, fetch_time), grant, slot, ask.now)),
        }
    }

    /// Asks the host's item for a start, unless this sandbox's view already shows a
    /// cooldown or a schedule full past the horizon. A start later than now (the schedule
    /// runs ahead) takes its slot only just before the start: a slot is held for the fetch,
    /// not for the sleep before it.
    async fn asked<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        ask: &Ask,
        booker: Option<&Booker>,
    ) -> Result<Taken, StoreError> {
        let seen = self.view(host);
        let unslotted = Ask { slot: None, ..*ask };
        let taken = match limits::decide(&seen, &unslotted).0 {
            Grant::StartAt(at) if at > ask.now => {
                store.take_host(host, &unslotted, &seen, booker).await?
            }
            Grant::StartAt(_) => store.take_host(host, ask, &seen, booker).await?,
            early => (early, seen, None),
        };
        self.remember(host, taken.1.clone());
        Ok(taken)
    }

    /// Gives back the end of the host's schedule if a run that no longer wants work booked
    /// it (its run cancelled or finished, its job paused), so `booker`'s task need not
    /// wait behind copies that will only be acked. Only a schedule more than
    /// [`GIVE_BACK_PAST_MS`] ahead is looked at. This sandbox's view may be behind the host's
    /// item (other sandboxes booked since), so a refusal reads the item and tries once more.
    /// True when the end moved back.
    async fn gave_back_for<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        booker: &Booker,
        now: Millis,
    ) -> Result<bool, StoreError> {
        for _ in 0..2 {
            let view = self.view(host);
            let Some((tail, to)) = view.reclaimable(now, GIVE_BACK_PAST_MS) else {
                return Ok(false);
            };
            if tail.run == *booker || self.wants_work(store, &tail.run).await? {
                return Ok(false);
            }
            let tail = tail.clone();
            if store.give_back(host, &tail, to, now).await? {
                tracing::info!(
                    host = host.as_str(),
                    run = %tail.run,
                    given_back_ms = tail.until.saturating_sub(to),
                    "a run that no longer wants work gave its bookings back"
                );
                self.remember(host, given_back(view, to, now));
                return Ok(true);
            }
            self.remember(host, store.host(host).await?);
        }
        Ok(false)
    }

    /// Whether the booker's job and run want work. A yes is kept for
    /// [`WANTS_WORK_KEPT_MS`], so the tasks of two runs taking turns on a host read it
    /// seldom.
    async fn wants_work<S: HostStore>(
        &self,
        store: &S,
        booker: &Booker,
    ) -> Result<bool, StoreError> {
        let now = now_ms();
        let kept = |kept: &HashMap<Booker, Millis>| {
            kept.get(booker)
                .is_some_and(|at| now < at + WANTS_WORK_KEPT_MS)
        };
        if kept(&self.working.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(true);
        }
        let wants = store.booker_wants_work(booker).await?;
        let mut working = self.working.lock().unwrap_or_else(PoisonError::into_inner);
        if working.len() >= MOST_HOSTS {
            working.clear();
        }
        if wants {
            working.insert(booker.clone(), now);
        }
        Ok(wants)
    }

    /// What this sandbox asks of a host for one fetch now, based on its view: the interval
    /// (slowed as the view says), the horizon for sleeping, and a slot until the fetch's
    /// fetch_time ends. The horizon leaves the fetch the host's usual answer time. A start
    /// later than that is booked for another invocation, rather than fetched and cut off by
    /// this invocation's end.
    pub(super) fn ask(&self, seen: &HostState, limits: HostLimits, fetch_time: Duration) -> Ask {
        let now = now_ms();
        let answer = seen.usual_answer().unwrap_or_default();
        let sleep = self
            .max_sleep
            .min(fetch_time.saturating_sub(answer.max(crate::domain::time::MIN_FETCH)));
        let horizon = now + millis(sleep);
        let until = horizon + millis(fetch_time) + SLOT_MARGIN_MS;
        Ask {
            now,
            interval: limits::interval(limits.max_rps, seen.slowdown_at(now)),
            horizon,
            slot: limits
                .max_inflight
                .map(|max| Slot::new(pick_slot(seen, max, now), until)),
            slots: limits.max_inflight.unwrap_or(0),
        }
    }

    /// The schedule is full past the sleep, so book the next start (up to `far`). The record
    /// then comes back once, at its turn, instead of asking again and again. A start this
    /// sandbox already booked along with an earlier record's is used first, without a write.
    /// Otherwise this record books consecutive starts in one write, for itself and for the
    /// records `waiting` their turn behind it.
    pub(super) async fn book<S: HostStore>(
        &self,
        store: &S,
        (host, booker): (&Host, Option<&Booker>),
        ask: Ask,
        far: Millis,
        (spare, waiting): (&mut VecDeque<(Millis, Millis)>, usize),
    ) -> Result<Entry, StoreError> {
        let interval = ask.interval.unwrap_or(0);
        if let Some(start) = next_spare(spare, &self.view(host), ask.now) {
            return Ok(booked(start, ask.now));
        }
        let together = (1 + waiting).min(MOST_BOOKED_TOGETHER) as Millis;
        let far = Ask {
            horizon: far,
            interval: ask.interval.map(|i| i * together),
            ..ask
        };
        let (grant, state, _) = store
            .take_host(host, &far, &self.view(host), booker)
            .await?;
        self.remember(host, state);
        Ok(match grant {
            Grant::StartAt(start) => {
                spare.extend((1..together).map(|i| (start + i * interval, ask.now)));
                booked(start, ask.now)
            }
            Grant::Later(start) => Entry::Hold(jittered(start - ask.now), HoldReason::Host),
            Grant::Wait(wait) => Entry::Hold(jittered(wait), HoldReason::Host),
        })
    }

    /// Called when the fetch is over. The sandbox learns from the fetch's sign of the host's
    /// health (`domain::health`). Trouble (a push-back, a failure, or an answer time that
    /// shows the site is queueing) is recorded for every sandbox. Then the slot is given
    /// back, with the host's answer times in the same write. A failure here is only logged:
    /// the slot then expires on its own.
    pub async fn leave<S: HostStore>(
        &self,
        store: &S,
        permit: Permit,
        sign: Option<Sign>,
        measures: &Measures,
    ) {
        let Some((host, max_rps)) = permit.host else {
            return;
        };
        let mut view = self.view(&host);
        let answers = match sign {
            Some(Sign::Answered(ms)) => Some(health::learn(&view, ms)),
            _ => None,
        };
        let now = now_ms();
        let started = permit.start;
        if let Some(sign) = sign
            && health::trouble(&view, (sign, answers), (started, now), max_rps).is_some()
        {
            measures.polite.cooldowns.fetch_add(1, ORDER);
            if let Err(err) = self.push_back(store, &host, max_rps, (sign, started)).await {
                tracing::warn!(error = %err, host = host.as_str(), "could not record the host's trouble");
            }
            view = self.view(&host);
        }
        view.answers = answers.or(view.answers);
        if answers.is_some() {
            view.failing_until = None;
        }
        let Some(slot) = permit.slot else {
            return self.remember(&host, view);
        };
        if let Some(kept) = view.slots.get_mut(slot.index) {
            *kept = None;
        }
        self.remember(&host, view);
        if let Err(err) = store.leave_host(&host, slot, answers).await {
            tracing::warn!(error = %err, host = host.as_str(), "could not give the host's slot back; it lapses");
        }
    }

    /// Records the host's trouble. It is computed from the host's item as stored (read
    /// first), not from this sandbox's view. The slowdown is raised (once per round of
    /// fetches), and the cooldown is recorded unless a longer one is already set. If another
    /// sandbox records trouble between the read and the write, the next try builds on it
    /// and never overwrites it. This sandbox's view then shows what is in force.
    pub(super) async fn push_back<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        max_rps: Option<f64>,
        (sign, started): (Sign, Millis),
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let mut state = store.host(host).await?;
        for _ in 0..PUSH_BACK_TRIES {
            let answers = match sign {
                Sign::Answered(ms) => Some(health::learn(&state, ms)),
                _ => None,
            };
            let Some(trouble) = health::trouble(&state, (sign, answers), (started, now), max_rps)
            else {
                break;
            };
            match store.push_back(host, &state, trouble, now).await? {
                PushedBack::Recorded => {
                    state = recorded(state, trouble, now);
                    break;
                }
                PushedBack::Refused(standing) => {
                    let stood = standing.cooldown_until >= trouble.cooldown_until
                        && trouble.cooldown_until.is_some();
                    state = *standing;
                    if stood {
                        break;
                    }
                }
            }
        }
        tracing::info!(
            host = host.as_str(),
            ?sign,
            cooldown_ms = state.cooldown_until.unwrap_or(now).saturating_sub(now),
            slowdown = state.slowdown_at(now),
            "host in trouble: the fleet slows"
        );
        self.remember(host, state);
        Ok(())
    }

    /// This sandbox's turn lock for the host.
    pub(super) fn turn(&self, host: &Host) -> Arc<HostTurn> {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if turns.len() >= MOST_HOSTS && !turns.contains_key(host) {
            turns.retain(|_, turn| turn.spare.try_lock().is_err());
        }
        turns.entry(host.clone()).or_default().clone()
    }

    pub(super) fn view(&self, host: &Host) -> HostState {
        let views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        views.get(host).cloned().unwrap_or_default()
    }

    pub(super) fn remember(&self, host: &Host, state: HostState) {
        let mut views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        if views.len() >= MOST_HOSTS && !views.contains_key(host) {
            views.clear();
        }
        views.insert(host.clone(), state);
    }
}

/// The host's item after `trouble` was recorded on `state` at `now`.
fn recorded(state: HostState, trouble: Trouble, now: Millis) -> HostState {
    let mut after = HostState {
        cooldown_until: trouble.cooldown_until.or(state.cooldown_until),
        cooldown_ms: trouble.cooldown_ms.or(state.cooldown_ms),
        failing_until: trouble.failing_until.or(state.failing_until),
        ..state
    };
    if let Some(slowdown) = trouble.slowdown {
        after.slowdown = Some((slowdown, now));
        after.knee = trouble.knee;
        after.next_start = trouble.next_start.or(after.next_start);
    }
    after
}

/// The host's view after its schedule's end was given back to `to` at `now`.
fn given_back(view: HostState, to: Millis, now: Millis) -> HostState {
    HostState {
        next_start: Some(to),
        tail: None,
        given_back: Some((to, now)),
        ..view
    }
}

/// A grant that books nothing becomes a permit or a wait. A permit's slot is already taken,
/// or, when its start is later than now, is taken just before the start.
fn granted(
    (host, limits, fetch_time): (&Host, HostLimits, Duration),
    grant: Grant,
    slot: Option<Slot>,
    now: Millis,
) -> Entry {
    let wait = match grant {
        Grant::StartAt(start) => {
            let slot_only = HostLimits {
                max_rps: None,
                ..limits
            };
            let at_start = (slot.is_none() && limits.max_inflight.is_some())
                .then_some((slot_only, fetch_time));
            return Entry::Go(Permit {
                host: Some((host.clone(), limits.max_rps)),
                slot,
                start,
                at_start,
                far: None,
                given_at: now,
                booker: None,
            });
        }
        Grant::Later(at) => at - now,
        Grant::Wait(wait) => wait,
    };
    Entry::Hold(jittered(wait), HoldReason::Host)
}

/// The first start booked together that a copy can still come back in time for, and that
/// no drop in pace has voided since it was booked. A start too near would be missed. A drop
/// in pace restarts the schedule from its time, which voids earlier bookings. The starts
/// skipped are removed.
fn next_spare(
    spare: &mut VecDeque<(Millis, Millis)>,
    view: &HostState,
    now: Millis,
) -> Option<Millis> {
    while let Some((start, booked_at)) = spare.pop_front() {
        if start > now + BOOKING_LEAD_MS && !health::voided(view, booked_at) {
            return Some(start);
        }
    }
    None
}

/// A start booked at `now`: come back a little before it.
fn booked(start: Millis, now: Millis) -> Entry {
    Entry::Booked {
        start,
        delay: Duration::from_millis(start.saturating_sub(now + BOOKING_LEAD_MS)),
    }
}

/// The slot to ask for: a random free slot in this sandbox's view, so its records do not
/// all ask for the same one. If none is free, the one whose lease ends first. The view may
/// be out of date; the host's item decides.
fn pick_slot(seen: &HostState, max: u32, now: Millis) -> usize {
    let free: Vec<usize> = (0..max as usize)
        .filter(|&i| !seen.slot_taken(i, now))
        .collect();
    if free.is_empty() {
        (0..max as usize)
            .min_by_key(|&i| seen.slot_until(i))
            .unwrap_or(0)
    } else {
        free[fastrand::usize(..free.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_booked_together_is_given_unless_too_near_or_booked_before_the_pace_dropped() {
        // Arrange: three starts booked together at 1 000; the pace dropped at 1 500.
        let now = 2_000;
        let booked = |starts: &[Millis]| -> VecDeque<(Millis, Millis)> {
            starts.iter().map(|&start| (start, 1_000)).collect()
        };
        let dropped = HostState {
            slowdown: Some((2.0, 1_500)),
            ..HostState::default()
        };
        let (mut steady, mut slowed) = (booked(&[3_000, 5_000, 6_000]), booked(&[5_000, 6_000]));

        // Act
        let given = next_spare(&mut steady, &HostState::default(), now);
        let void = next_spare(&mut slowed, &dropped, now);

        // Assert
        assert_eq!(given, Some(5_000), "3 000 is too near to come back for");
        assert_eq!(steady, booked(&[6_000]));
        assert_eq!(void, None, "the drop restarted the schedule");
        assert!(slowed.is_empty());
    }
}
