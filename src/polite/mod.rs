//! Politeness shared by the whole fleet: each host's rate, in-flight fetches and cooldown
//! (`limits`, kept in DynamoDB by `store::hosts`), and its robots.txt (`robots`), fetched once
//! per host for every sandbox. The gate stands between the guard's reads and the claim: a
//! record whose host has no room is not fetched, and waits without burning an attempt.

pub mod robots;

/// The host's limits and their rule live in the domain; re-exported where the gate uses them.
pub use crate::domain::limits::{self, JobPoliteness};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::domain::limits::{Ask, Grant, Host, HostLimits, HostState, Millis};
use robots::{Parsed, Verdict};

use crate::domain::time::epoch_millis;
use crate::metrics::Measures;
use crate::scraper::{self, Fetcher};
use crate::store::error::AwsError;
use crate::store::hosts::{HostStore, RobotsRecord};

/// The fleet's politeness settings (`HOST_MAX_RPS`, `HOST_MAX_INFLIGHT`, `OBEY_ROBOTS`, ...).
#[derive(Debug, Clone)]
pub struct Politeness {
    /// For a host no job says otherwise about.
    pub limits: HostLimits,
    pub obey_robots: bool,
    pub robots_ttl: Duration,
    /// How long a robots.txt that could not be had (5xx, unreachable) holds its host.
    pub robots_retry: Duration,
    /// The robots.txt fetch's own timeout (`ROBOTS_TIMEOUT_MS`).
    pub robots_timeout: Duration,
    /// The longest wait for a host slept inside the invocation; a longer one is a hold.
    pub max_sleep: Duration,
    /// The longest a task waits for its host in all (`POLITE_MAX_WAIT_MS`), from its first
    /// wait; past it, the task fails ("waited too long for its host").
    pub max_wait: Duration,
    /// The product token robots.txt groups are matched against.
    pub agent: String,
}

impl Politeness {
    /// No limits and no robots.txt (tests and benchmarks of other things).
    pub fn off() -> Self {
        Self {
            limits: HostLimits::none(),
            obey_robots: false,
            robots_ttl: Duration::from_secs(86_400),
            robots_retry: Duration::from_secs(60),
            robots_timeout: Duration::from_secs(5),
            max_sleep: Duration::from_secs(1),
            max_wait: Duration::from_secs(48 * 3_600),
            agent: "*".into(),
        }
    }
}

/// What the gate says of a record.
#[derive(Debug)]
pub enum Entry {
    /// Fetch now; give the permit back with [`Gate::leave`].
    Go(Permit),
    /// Not now: come back after this long (why, for logs and metrics).
    Hold(Duration, HoldReason),
    /// The host's schedule is full past what may be slept: this record's start is booked
    /// at `start`; come back after `delay` (a little before it) with the booking.
    Booked { start: Millis, delay: Duration },
    /// robots.txt forbids the URL.
    Disallowed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// The host's rate, slots or cooldown.
    Host,
    /// The host's robots.txt is being fetched by another sandbox, or could not be had.
    Robots,
}

/// A fetch let through: its host and slot, and the start it may not go before (slept in
/// [`Gate::ready`], after the claim, so the claim's time is not added to the start).
#[derive(Debug, Default)]
pub struct Permit {
    host: Option<(Host, Option<f64>)>,
    slot: Option<(usize, Millis)>,
    start: Millis,
    /// A booked start: its slot (and the cooldown) is asked of the host's item just before
    /// the start, in one write, not when the record arrives (the limits and the fetch's
    /// budget to ask with).
    at_start: Option<(HostLimits, Duration)>,
    /// The latest start the record may be booked for, if its start is missed.
    far: Millis,
}

/// A permit given back before its fetch: come back after `delay`, with the start booked
/// meanwhile, if one was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Later {
    pub delay: Duration,
    pub booked: Option<Millis>,
}

impl Later {
    fn after(delay: Duration) -> Self {
        Self {
            delay,
            booked: None,
        }
    }
}

/// What a record brings to the gate: its URL, the start a copy carries (booked on an
/// earlier delivery), and how much longer it may wait for its host.
#[derive(Debug, Clone, Copy)]
pub struct Visit<'a> {
    pub url: &'a str,
    pub booked: Option<Millis>,
    pub wait_left: Duration,
}

/// The gate and what this sandbox knows of hosts between invocations (a view is refreshed
/// by every answer of the host's item; a robots.txt kept until the fleet's copy expires).
#[derive(Debug)]
pub struct Gate {
    settings: Politeness,
    views: Mutex<HashMap<Host, HostState>>,
    turns: Mutex<HashMap<Host, Arc<HostTurn>>>,
    robots: Mutex<HashMap<Host, Arc<KeptRobots>>>,
}

/// A host's turn in this sandbox: one ask of the host's item at a time, the starts booked
/// together for records of the host that were waiting their turn (in order), and how many
/// such records wait for it now.
#[derive(Debug, Default)]
struct HostTurn {
    spare: tokio::sync::Mutex<VecDeque<Millis>>,
    waiting: AtomicUsize,
}

/// Starts booked in one write at most: a batch's records of one host, which arrive together
/// (a one-host run's backlog books a write per ten tasks, not per task).
const MOST_BOOKED_TOGETHER: usize = 10;

/// A host's robots.txt as this sandbox keeps it, until the fleet's copy expires. The lock is
/// held while it is read or fetched, so a sandbox's records of one host wait for one answer.
type KeptRobots = tokio::sync::Mutex<Option<(Parsed, Millis)>>;

/// Hosts a sandbox keeps views of; past it, it forgets them all.
const MOST_HOSTS: usize = 4_096;
/// A fleet-wide robots.txt fetch is its taker's for this long.
const ROBOTS_LEASE_MS: Millis = 30_000;
/// How long a record waits for another sandbox's robots.txt fetch, reading the fleet's copy
/// this often meanwhile.
const ROBOTS_WAIT: Duration = Duration::from_secs(2);
const ROBOTS_POLL: Duration = Duration::from_millis(250);
/// How long a record that has too little time to fetch robots.txt waits for a fresh
/// invocation.
const ROBOTS_SHORT_WAIT_MS: Millis = 1_000;
/// A slot is held this much past its fetch's budget, for the time to give it back.
const SLOT_MARGIN_MS: Millis = 5_000;
/// The host's item is asked this long before a slept start (a slot taken, or the cooldown
/// read), so the answer is in before the start even from a loaded table.
const READ_LEAD_MS: Millis = 250;
/// The budget a missed start is taken again with (it sleeps at most `POLITE_SLEEP_MAX_MS`).
const AGAIN_BUDGET: Duration = Duration::from_secs(3);
/// A booked record comes back this much before its start (SQS delays whole seconds and
/// delivers a moment late), and sleeps the rest.
const BOOKING_LEAD_MS: Millis = 1_500;

impl Gate {
    pub fn new(settings: Politeness) -> Self {
        Self {
            settings,
            views: Mutex::default(),
            turns: Mutex::default(),
            robots: Mutex::default(),
        }
    }

    /// A job's limits over the fleet's (0: none).
    fn limits(&self, job: &JobPoliteness) -> HostLimits {
        let defaults = self.settings.limits;
        HostLimits {
            max_rps: job
                .max_rps
                .map_or(defaults.max_rps, |r| (r > 0.0).then_some(r)),
            max_inflight: job
                .max_inflight
                .map_or(defaults.max_inflight, |n| (n > 0).then_some(n)),
        }
    }

    /// Whether the visit's URL may be fetched now (a short wait for the host's schedule is
    /// slept in [`Gate::ready`]), else when to come back.
    pub async fn enter<S: HostStore, F: Fetcher>(
        &self,
        (store, fetcher): (&S, &F),
        visit: Visit<'_>,
        job: &JobPoliteness,
        budget: Duration,
        measures: &Measures,
    ) -> Result<Entry, AwsError> {
        let parsed = url::Url::parse(visit.url).ok();
        let Some((parsed, host)) = parsed.and_then(|u| Host::of(&u).map(|h| (u, h))) else {
            // The fetcher refuses what is no http(s) URL with a host.
            return Ok(Entry::Go(Permit::default()));
        };
        let mut limits = self.limits(job);
        if job.obey_robots.unwrap_or(self.settings.obey_robots) {
            let says = self.robots((store, fetcher), &host, &parsed, limits, budget, measures);
            match says.await? {
                RobotsSays::Fetch { crawl_delay } => limits = limits.with_crawl_delay(crawl_delay),
                RobotsSays::Disallowed => {
                    measures.polite.robots_disallowed.fetch_add(1, ORDER);
                    return Ok(Entry::Disallowed);
                }
                RobotsSays::Wait(wait) => return Ok(Entry::Hold(wait, HoldReason::Robots)),
            }
        }
        let far = now_ms() + millis(visit.wait_left);
        let booked = visit.booked;
        let entry = match booked.and_then(|start| self.booked(&host, limits, (start, budget))) {
            Some(entry) => entry,
            None => self.take(store, &host, limits, budget, Some(far)).await?,
        };
        Ok(match entry {
            Entry::Go(permit) => Entry::Go(Permit { far, ..permit }),
            other => other,
        })
    }

    /// Whether a copy booked for `start` missed it by more than the interval of the job's
    /// limits (its booking is void: it would bunch with the next starts).
    pub fn missed(&self, start: Millis, job: &JobPoliteness) -> bool {
        let interval = limits::interval(self.limits(job).max_rps, 1.0).unwrap_or(0);
        now_ms() > start + interval
    }

    /// How long a copy booked for `start` that came early waits on (none: it is due), at
    /// no request.
    pub fn parked(&self, start: Millis) -> Option<Duration> {
        let now = now_ms();
        (start > now + BOOKING_LEAD_MS + millis(self.settings.max_sleep))
            .then(|| Duration::from_millis(start - now - BOOKING_LEAD_MS))
    }

    /// A booked start, without a request: come back nearer to it, or go at it (its slot is
    /// asked for just before it, in [`Gate::ready`]). `None`: the booking was missed by more
    /// than its interval and is void (the record asks again like any other).
    fn booked(
        &self,
        host: &Host,
        limits: HostLimits,
        (start, budget): (Millis, Duration),
    ) -> Option<Entry> {
        let now = now_ms();
        let interval = limits::interval(limits.max_rps, 1.0).unwrap_or(0);
        if now > start + interval {
            return None;
        }
        if let Some(delay) = self.parked(start) {
            return Some(Entry::Booked { start, delay });
        }
        // A cooldown this sandbox already knows of holds the record at no request.
        if let Some(until) = self.view(host).cooldown_until.filter(|u| *u > now) {
            return Some(Entry::Hold(jittered(until - now), HoldReason::Host));
        }
        Some(Entry::Go(Permit {
            host: Some((host.clone(), limits.max_rps)),
            slot: None,
            start,
            at_start: Some((limits, budget)),
            far: 0,
        }))
    }

    /// The host's schedule and a slot for one fetch: asked of the host's item unless this
    /// sandbox's view already shows a cooldown or a schedule full past the horizon (those
    /// only move later), then slept until the start. A schedule full past the sleep books
    /// the next start if it is before `far` (none: never books).
    async fn take<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        limits: HostLimits,
        budget: Duration,
        far: Option<Millis>,
    ) -> Result<Entry, AwsError> {
        if limits.is_none() {
            return Ok(Entry::Go(Permit::default()));
        }
        // One ask of this sandbox's at a time per host, each from the last answer: its
        // records do not race each other for the host's item. Those that may book are
        // counted while they wait, so the one asking can book for them too.
        let turn = self.turn(host);
        let booking = usize::from(far.is_some());
        turn.waiting.fetch_add(booking, ORDER);
        let mut spare = turn.spare.lock().await;
        turn.waiting.fetch_sub(booking, ORDER);
        let seen = self.view(host);
        let ask = self.ask(&seen, limits, budget);
        let unslotted = Ask { slot: None, ..ask };
        // A start later than now (the schedule runs ahead) takes its slot only just before
        // it: a slot is held for the fetch, not for the sleep toward it.
        let (grant, state, slot) = match limits::decide(&seen, &unslotted).0 {
            Grant::StartAt(at) if at > ask.now => store.take_host(host, &unslotted, &seen).await?,
            Grant::StartAt(_) => store.take_host(host, &ask, &seen).await?,
            early => (early, seen, None),
        };
        self.remember(host, state);
        match (grant, far) {
            (Grant::Later(_), Some(far)) => {
                let together = (&mut *spare, turn.waiting.load(ORDER));
                self.book(store, host, unslotted, far, together).await
            }
            (grant, _) => Ok(granted((host, limits, budget), grant, slot, ask.now)),
        }
    }

    /// What this sandbox asks of a host for one fetch now, from its view: the interval
    /// (slowed as the view says), the sleep's horizon, a slot until the fetch's budget ends.
    fn ask(&self, seen: &HostState, limits: HostLimits, budget: Duration) -> Ask {
        let now = now_ms();
        let sleep = self
            .settings
            .max_sleep
            .min(budget.saturating_sub(crate::domain::time::MIN_FETCH));
        let horizon = now + millis(sleep);
        let until = horizon + millis(budget) + SLOT_MARGIN_MS;
        Ask {
            now,
            interval: limits::interval(limits.max_rps, seen.slowdown_at(now)),
            horizon,
            slot: limits
                .max_inflight
                .map(|max| (pick_slot(seen, max, now), until)),
            slots: limits.max_inflight.unwrap_or(0),
        }
    }

    /// Sleeps until the permit's start. Just before it, the host's item is asked again: a
    /// booked start takes its slot there (one write, which checks the cooldown too), and a
    /// slept one reads the cooldown; a host that pushed back meanwhile (another sandbox saw
    /// its 429 or 503), or a slot still taken, gives the permit back and answers the wait.
    pub async fn ready<S: HostStore>(
        &self,
        store: &S,
        mut permit: Permit,
        measures: &Measures,
    ) -> Result<Result<Permit, Later>, AwsError> {
        let Some((host, max_rps)) = permit.host.clone() else {
            return Ok(Ok(permit));
        };
        let wait = permit.start.saturating_sub(now_ms());
        if wait > 0 || permit.at_start.is_some() {
            measures.polite.slept_ms.fetch_add(wait, ORDER);
            // The item is asked just before the start, not after it.
            tokio::time::sleep(Duration::from_millis(wait.saturating_sub(READ_LEAD_MS))).await;
            if let Err(wait) = self.at_start(store, &host, &mut permit).await? {
                self.leave(store, permit, None, measures).await;
                return Ok(Err(Later::after(wait)));
            }
            let left = permit.start.saturating_sub(now_ms());
            tokio::time::sleep(Duration::from_millis(left)).await;
        }
        // A start missed by more than its interval (the claim took that long) is void: the
        // fetch would bunch with the next ones. The schedule is taken again, once (booked, if
        // it is full past the sleep).
        let interval = limits::interval(max_rps, 1.0).unwrap_or(Millis::MAX);
        if now_ms() <= permit.start.saturating_add(interval) {
            return Ok(Ok(permit));
        }
        let schedule = HostLimits {
            max_rps,
            max_inflight: None,
        };
        let far = Some(permit.far);
        match self.take(store, &host, schedule, AGAIN_BUDGET, far).await? {
            Entry::Go(again) => {
                let wait = again.start.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                Ok(Ok(Permit {
                    start: again.start,
                    ..permit
                }))
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
            Entry::Disallowed => Ok(Ok(permit)),
        }
    }

    /// Just before the start: a booked start's slot (with an in-flight limit; the take
    /// checks the cooldown), else the cooldown read. `Err`: how long to wait instead.
    async fn at_start<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        permit: &mut Permit,
    ) -> Result<Result<(), Duration>, AwsError> {
        let now = now_ms();
        if let Some((limits, budget)) = permit.at_start.take()
            && limits.max_inflight.is_some()
        {
            let slot_only = HostLimits {
                max_rps: None,
                ..limits
            };
            return Ok(
                match self.take(store, host, slot_only, budget, None).await? {
                    Entry::Go(taken) => {
                        permit.slot = taken.slot;
                        Ok(())
                    }
                    Entry::Hold(wait, _) | Entry::Booked { delay: wait, .. } => Err(wait),
                    Entry::Disallowed => Ok(()),
                },
            );
        }
        let cooldown = store.host(host).await?.cooldown_until;
        Ok(match cooldown.filter(|until| *until > now) {
            Some(until) => Err(jittered(until - now)),
            None => Ok(()),
        })
    }

    /// The schedule is full past the sleep: book the next start (up to `far`), so the
    /// record comes back once, at its turn, rather than asking again and again. A start
    /// this sandbox booked together with an earlier record's is taken first, without a
    /// write; else this record books for itself and for the records `waiting` their turn
    /// behind it, consecutive starts in one write.
    async fn book<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        ask: Ask,
        far: Millis,
        (spare, waiting): (&mut VecDeque<Millis>, usize),
    ) -> Result<Entry, AwsError> {
        let interval = ask.interval.unwrap_or(0);
        while let Some(start) = spare.pop_front() {
            // One too near for a copy to come back in time is a start missed.
            if start > ask.now + BOOKING_LEAD_MS {
                return Ok(booked(start, ask.now));
            }
        }
        let together = (1 + waiting).min(MOST_BOOKED_TOGETHER) as Millis;
        let far = Ask {
            horizon: far,
            interval: ask.interval.map(|i| i * together),
            ..ask
        };
        let (grant, state, _) = store.take_host(host, &far, &self.view(host)).await?;
        self.remember(host, state);
        Ok(match grant {
            Grant::StartAt(start) => {
                spare.extend((1..together).map(|i| start + i * interval));
                booked(start, ask.now)
            }
            Grant::Later(start) => Entry::Hold(jittered(start - ask.now), HoldReason::Host),
            Grant::Wait(wait) => Entry::Hold(jittered(wait), HoldReason::Host),
        })
    }

    /// The fetch is over: if the host answered 429 or 503, the cooldown and slowdown every
    /// sandbox then obeys (from the host's item as it is, and only ever lengthening the
    /// cooldown), then its slot back. A failure here is logged: a slot lapses.
    pub async fn leave<S: HostStore>(
        &self,
        store: &S,
        permit: Permit,
        answer: Option<(u16, Option<Duration>)>,
        measures: &Measures,
    ) {
        let Some((host, max_rps)) = permit.host else {
            return;
        };
        if let Some((429 | 503, retry_after)) = answer {
            measures.polite.cooldowns.fetch_add(1, ORDER);
            let retry_after = retry_after.map(|d| d.as_millis() as Millis);
            if let Err(err) = self.push_back(store, &host, max_rps, retry_after).await {
                tracing::warn!(error = %err, host = host.as_str(), "could not record the host's push-back");
            }
        }
        let mut view = self.view(&host);
        let Some((slot, until)) = permit.slot else {
            return;
        };
        if let Some(kept) = view.slots.get_mut(slot) {
            *kept = None;
        }
        self.remember(&host, view);
        if let Err(err) = store.leave_host(&host, (slot, until)).await {
            tracing::warn!(error = %err, host = host.as_str(), "could not give the host's slot back; it lapses");
        }
    }

    /// A 429 or 503: the slowdown doubled from what the host's item has in force, the
    /// cooldown from `Retry-After` (or one slowed interval), recorded unless a longer one
    /// stands; this sandbox's view then shows whichever is in force.
    async fn push_back<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        max_rps: Option<f64>,
        retry_after: Option<Millis>,
    ) -> Result<(), AwsError> {
        let now = now_ms();
        let mut state = store.host(host).await?;
        let (until, slowdown) = limits::push_back(&state, now, max_rps, retry_after);
        if store.push_back(host, (until, slowdown), now).await? {
            state.cooldown_until = Some(until);
            state.slowdown = Some((slowdown, now));
        }
        tracing::info!(
            host = host.as_str(),
            cooldown_ms = state.cooldown_until.unwrap_or(now).saturating_sub(now),
            slowdown = state.slowdown_at(now),
            "host pushed back"
        );
        self.remember(host, state);
        Ok(())
    }

    /// The host's turn lock of this sandbox.
    fn turn(&self, host: &Host) -> Arc<HostTurn> {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if turns.len() >= MOST_HOSTS && !turns.contains_key(host) {
            turns.retain(|_, turn| turn.spare.try_lock().is_err());
        }
        turns.entry(host.clone()).or_default().clone()
    }

    fn view(&self, host: &Host) -> HostState {
        let views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        views.get(host).cloned().unwrap_or_default()
    }

    fn remember(&self, host: &Host, state: HostState) {
        let mut views = self.views.lock().unwrap_or_else(PoisonError::into_inner);
        if views.len() >= MOST_HOSTS && !views.contains_key(host) {
            views.clear();
        }
        views.insert(host.clone(), state);
    }
}

/// The robots.txt of `url`'s host, its first 500 KiB, within `budget`: metered for the fleet,
/// not charged to a run (one robots.txt serves them all).
async fn robots_fetched<F: Fetcher>(
    fetcher: &F,
    url: &url::Url,
    budget: Duration,
    measures: &Measures,
) -> Result<crate::domain::model::Page, scraper::FetchError> {
    let robots_url = robots::robots_url(url).unwrap_or_default();
    let ask = scraper::Ask {
        keep_first: Some(robots::MAX_ROBOTS_BYTES as u64),
        ..scraper::Ask::within(budget)
    };
    let fetched = fetcher.fetch(&robots_url, ask).await;
    measures.spent(&fetched.spend);
    measures.polite.robots_fetches.fetch_add(1, ORDER);
    fetched.page
}

/// A grant that books nothing: a permit (its slot taken, or to be taken just before its
/// start when it is later than now), or the wait.
fn granted(
    (host, limits, budget): (&Host, HostLimits, Duration),
    grant: Grant,
    slot: Option<(usize, Millis)>,
    now: Millis,
) -> Entry {
    let wait = match grant {
        Grant::StartAt(start) => {
            let slot_only = HostLimits {
                max_rps: None,
                ..limits
            };
            let at_start =
                (slot.is_none() && limits.max_inflight.is_some()).then_some((slot_only, budget));
            return Entry::Go(Permit {
                host: Some((host.clone(), limits.max_rps)),
                slot,
                start,
                at_start,
                far: 0,
            });
        }
        Grant::Later(at) => at - now,
        Grant::Wait(wait) => wait,
    };
    Entry::Hold(jittered(wait), HoldReason::Host)
}

/// A start booked at `now`: come back a little before it.
fn booked(start: Millis, now: Millis) -> Entry {
    Entry::Booked {
        start,
        delay: Duration::from_millis(start.saturating_sub(now + BOOKING_LEAD_MS)),
    }
}

/// What robots.txt lets a record do.
enum RobotsSays {
    Fetch { crawl_delay: Option<f64> },
    Disallowed,
    Wait(Duration),
}

impl Gate {
    /// The host's robots.txt: kept by this sandbox, else the fleet's copy, else fetched once
    /// for the fleet (through the host's schedule like any fetch) while others wait.
    async fn robots<S: HostStore, F: Fetcher>(
        &self,
        (store, fetcher): (&S, &F),
        host: &Host,
        url: &url::Url,
        limits: HostLimits,
        budget: Duration,
        measures: &Measures,
    ) -> Result<RobotsSays, AwsError> {
        let kept = self.kept_robots(host);
        let mut kept = kept.lock().await;
        let now = now_ms();
        if let Some((parsed, until)) = kept.as_ref().filter(|(_, until)| *until > now) {
            return Ok(says(parsed, url).or_until(*until, now));
        }
        let record = match store.robots(host).await?.filter(|r| r.expires_at > now) {
            Some(record) => record,
            None => {
                let fetched =
                    self.fetch_robots((store, fetcher), host, url, limits, budget, measures);
                match fetched.await? {
                    Ok(record) => record,
                    Err(RobotsSays::Wait(wait)) => {
                        // This sandbox's other records of the host wait as long, at once.
                        *kept = Some((Parsed::Unavailable, now_ms() + millis(wait)));
                        return Ok(RobotsSays::Wait(wait));
                    }
                    Err(says) => return Ok(says),
                }
            }
        };
        let parsed = Parsed::of(&record.rules, &self.settings.agent);
        *kept = Some((parsed.clone(), record.expires_at));
        Ok(says(&parsed, url).or_until(record.expires_at, now_ms()))
    }

    /// The fleet's one fetch of a host's robots.txt, stored for every sandbox; or what to
    /// do while another sandbox has it.
    async fn fetch_robots<S: HostStore, F: Fetcher>(
        &self,
        (store, fetcher): (&S, &F),
        host: &Host,
        url: &url::Url,
        limits: HostLimits,
        budget: Duration,
        measures: &Measures,
    ) -> Result<Result<RobotsRecord, RobotsSays>, AwsError> {
        let timeout = self.settings.robots_timeout;
        // The cooldown is read before the fleet's lease is taken, so a host cooling down
        // holds no lease for the others to wait out.
        let now = now_ms();
        if let Some(until) = store.host(host).await?.cooldown_until.filter(|u| *u > now) {
            return Ok(Err(RobotsSays::Wait(jittered(until - now))));
        }
        if !store
            .take_robots_fetch(host, now, now + ROBOTS_LEASE_MS)
            .await?
        {
            return self.await_robots(store, host, budget).await;
        }
        // Outside the schedule and the slots: one request a day for the whole fleet, which
        // must not queue behind the starts the host's records have booked. Its push-back
        // still cools the host.
        let permit = Permit {
            host: Some((host.clone(), limits.max_rps)),
            ..Permit::default()
        };
        let fetched = robots_fetched(fetcher, url, budget.min(timeout), measures).await;
        let answer = fetched
            .as_ref()
            .err()
            .and_then(|e| e.http_status.map(|s| (s, e.retry_after)));
        self.leave(store, permit, answer, measures).await;
        // Cut short by this record's budget, not by its own timeout: no answer of the site's.
        // A record with time comes back for it (the lease lapses meanwhile).
        if budget < timeout && fetched.as_ref().is_err_and(|e| e.timed_out) {
            return Ok(Err(RobotsSays::Wait(jittered(ROBOTS_SHORT_WAIT_MS))));
        }
        let lasts = (
            millis(self.settings.robots_ttl),
            millis(self.settings.robots_retry),
        );
        let record = robots::record_of(&fetched, now_ms(), lasts);
        let record = store.put_robots(host, record).await?;
        tracing::info!(
            host = host.as_str(),
            rules = record.rules.kind(),
            "robots.txt fetched for the fleet"
        );
        Ok(Ok(record))
    }

    /// Another sandbox is fetching the host's robots.txt: its copy is read a few times within
    /// [`ROBOTS_WAIT`] (the fetch takes moments), so the host's first records need not be sent
    /// away to wait; then they wait as copies.
    async fn await_robots<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        budget: Duration,
    ) -> Result<Result<RobotsRecord, RobotsSays>, AwsError> {
        let until = tokio::time::Instant::now() + ROBOTS_WAIT.min(budget / 2);
        while tokio::time::Instant::now() + ROBOTS_POLL < until {
            tokio::time::sleep(ROBOTS_POLL).await;
            if let Some(record) = store
                .robots(host)
                .await?
                .filter(|r| r.expires_at > now_ms())
            {
                return Ok(Ok(record));
            }
        }
        Ok(Err(RobotsSays::Wait(jittered(millis(ROBOTS_WAIT)))))
    }

    /// The host's entry, made if it has none.
    fn kept_robots(&self, host: &Host) -> Arc<KeptRobots> {
        let mut kept = self.robots.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= MOST_HOSTS && !kept.contains_key(host) {
            kept.retain(|_, entry| entry.try_lock().is_err());
        }
        kept.entry(host.clone()).or_default().clone()
    }
}

fn says(parsed: &Parsed, url: &url::Url) -> RobotsSays {
    match parsed.verdict(url.as_str()) {
        Verdict::Allowed { crawl_delay } => RobotsSays::Fetch { crawl_delay },
        Verdict::Disallowed => RobotsSays::Disallowed,
        // How long: `or_until`, from the copy's expiry.
        Verdict::Unavailable => RobotsSays::Wait(Duration::ZERO),
    }
}

impl RobotsSays {
    /// An unavailable robots.txt holds until the fleet's copy expires.
    fn or_until(self, expires_at: Millis, now: Millis) -> Self {
        match self {
            RobotsSays::Wait(_) => {
                RobotsSays::Wait(jittered(expires_at.saturating_sub(now).max(1_000)))
            }
            says => says,
        }
    }
}

/// The slot to ask for: any free in this sandbox's view (at random, so its records do not
/// all ask for the same one), else the one whose lease ends first (the view may be stale:
/// the host's item decides).
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

/// A wait with up to a quarter more, so the records a host held do not all come back at once.
fn jittered(wait: Millis) -> Duration {
    Duration::from_millis(wait + fastrand::u64(0..=wait / 4))
}

fn now_ms() -> Millis {
    epoch_millis(SystemTime::now()) as Millis
}

fn millis(d: Duration) -> Millis {
    d.as_millis() as Millis
}

const ORDER: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;
