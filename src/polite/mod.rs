//! Politeness shared by the whole fleet: each host's rate, in-flight fetches and cooldown
//! (`limits`, kept in DynamoDB by `store::hosts`), and its robots.txt (`robots`), fetched once
//! per host for every sandbox. The gate stands between the guard's reads and the claim: a
//! record whose host has no room is not fetched, and waits without burning an attempt.

pub mod limits;
pub mod robots;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use limits::{Ask, Grant, Host, HostLimits, HostState, Millis};
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
    /// The longest wait for a host slept inside the invocation; a longer one is a hold.
    pub max_sleep: Duration,
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
            max_sleep: Duration::from_secs(1),
            agent: "*".into(),
        }
    }
}

/// A job's own politeness (its item's `host_max_rps`, `host_max_inflight`, `obey_robots`;
/// data contract v2). A limit of 0 means none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobPoliteness {
    pub max_rps: Option<f64>,
    pub max_inflight: Option<u32>,
    pub obey_robots: Option<bool>,
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
}

/// The gate and what this sandbox knows of hosts between invocations (a view is refreshed
/// by every answer of the host's item; a robots.txt kept until the fleet's copy expires).
#[derive(Debug)]
pub struct Gate {
    settings: Politeness,
    views: Mutex<HashMap<Host, HostState>>,
    turns: Mutex<HashMap<Host, Arc<tokio::sync::Mutex<()>>>>,
    robots: Mutex<HashMap<Host, Arc<KeptRobots>>>,
}

/// A host's robots.txt as this sandbox keeps it, until the fleet's copy expires. The lock is
/// held while it is read or fetched, so a sandbox's records of one host wait for one answer.
type KeptRobots = tokio::sync::Mutex<Option<(Parsed, Millis)>>;

/// Hosts a sandbox keeps views of; past it, it forgets them all.
const MOST_HOSTS: usize = 4_096;
/// A fleet-wide robots.txt fetch is its taker's for this long.
const ROBOTS_LEASE_MS: Millis = 30_000;
/// How long a record waits for another sandbox's robots.txt fetch.
const ROBOTS_WAIT: Duration = Duration::from_secs(2);
/// A robots.txt fetch gets at most this long.
const ROBOTS_TIMEOUT: Duration = Duration::from_secs(10);
/// A slot is held this much past its fetch's budget, for the time to give it back.
const SLOT_MARGIN_MS: Millis = 5_000;
/// The cooldown is read this long before a slept start.
const READ_LEAD_MS: Millis = 100;
/// The budget a missed start is taken again with (it sleeps at most `POLITE_SLEEP_MAX_MS`).
const AGAIN_BUDGET: Duration = Duration::from_secs(3);
/// Starts are booked at most this far ahead (SQS delays a message at most 15 minutes).
const MOST_BOOKED_AHEAD_MS: Millis = 900_000;
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

    /// Whether `url` may be fetched now; sleeps a short wait for the host's schedule.
    /// `booked`: the start the host's schedule booked for this record on an earlier
    /// delivery, if any.
    pub async fn enter<S: HostStore, F: Fetcher>(
        &self,
        (store, fetcher): (&S, &F),
        (url, booked): (&str, Option<Millis>),
        job: &JobPoliteness,
        budget: Duration,
        measures: &Measures,
    ) -> Result<Entry, AwsError> {
        let parsed = url::Url::parse(url).ok();
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
        match booked {
            Some(start) => {
                self.take_booked(store, &host, limits, (start, budget))
                    .await
            }
            None => self.take(store, &host, limits, budget).await,
        }
    }

    /// A booked start: the slot alone is taken (the schedule was taken when it was booked),
    /// and the permit starts at the booking. A booking missed by more than its interval is
    /// void: the record asks again like any other.
    async fn take_booked<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        limits: HostLimits,
        (start, budget): (Millis, Duration),
    ) -> Result<Entry, AwsError> {
        let now = now_ms();
        let interval = limits::interval(limits.max_rps, 1.0).unwrap_or(0);
        if now > start + interval {
            return self.take(store, host, limits, budget).await;
        }
        if start > now + BOOKING_LEAD_MS + millis(self.settings.max_sleep) {
            let delay = Duration::from_millis(start - now - BOOKING_LEAD_MS);
            return Ok(Entry::Booked { start, delay });
        }
        let unscheduled = HostLimits {
            max_rps: None,
            ..limits
        };
        // The slot alone (its take checks the cooldown too); the start is the booked one.
        let entry = self.take(store, host, unscheduled, budget).await?;
        Ok(match entry {
            Entry::Go(mut permit) => {
                permit.host = Some((host.clone(), limits.max_rps));
                permit.start = start;
                Entry::Go(permit)
            }
            other => other,
        })
    }

    /// The host's schedule and a slot for one fetch: asked of the host's item unless this
    /// sandbox's view already shows a cooldown or a schedule full past the horizon (those
    /// only move later), then slept until the start.
    async fn take<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        limits: HostLimits,
        budget: Duration,
    ) -> Result<Entry, AwsError> {
        if limits.is_none() {
            return Ok(Entry::Go(Permit::default()));
        }
        // One ask of this sandbox's at a time per host, each from the last answer: its
        // records do not race each other for the host's item.
        let turn = self.turn(host);
        let turn = turn.lock().await;
        let now = now_ms();
        let seen = self.view(host);
        let sleep = self
            .settings
            .max_sleep
            .min(budget.saturating_sub(crate::worker::MIN_FETCH));
        let horizon = now + sleep.as_millis() as Millis;
        let interval = limits::interval(limits.max_rps, seen.slowdown_at(now));
        let until = horizon + budget.as_millis() as Millis + SLOT_MARGIN_MS;
        let slot = limits
            .max_inflight
            .map(|max| (pick_slot(&seen, max, now), until));
        let ask = Ask {
            now,
            interval,
            horizon,
            slot,
            slots: limits.max_inflight.unwrap_or(0),
        };
        let unslotted = Ask { slot: None, ..ask };
        let (grant, state, slot) = match limits::decide(&seen, &unslotted).0 {
            Grant::StartAt(_) => store.take_host(host, &ask, &seen).await?,
            early => (early, seen, None),
        };
        self.remember(host, state);
        let start = match grant {
            Grant::Later(_) => return self.book(store, host, unslotted).await,
            Grant::StartAt(at) => Ok(at),
            Grant::Wait(wait) => Err(wait),
        };
        drop(turn);
        match start {
            Ok(at) => {
                let host = Some((host.clone(), limits.max_rps));
                Ok(Entry::Go(Permit {
                    host,
                    slot,
                    start: at,
                }))
            }
            Err(wait) => Ok(Entry::Hold(jittered(wait), HoldReason::Host)),
        }
    }

    /// Sleeps until the permit's start; a host that pushed back meanwhile (another sandbox
    /// saw its 429 or 503) is read before the fetch and its cooldown obeyed: the permit is
    /// given back and the wait answered instead.
    pub async fn ready<S: HostStore>(
        &self,
        store: &S,
        permit: Permit,
        measures: &Measures,
    ) -> Result<Result<Permit, Duration>, AwsError> {
        let Some((host, max_rps)) = permit.host.clone() else {
            return Ok(Ok(permit));
        };
        let wait = permit.start.saturating_sub(now_ms());
        if wait > 0 {
            measures.polite.slept_ms.fetch_add(wait, ORDER);
            // The read is made just before the start, not after it.
            tokio::time::sleep(Duration::from_millis(wait.saturating_sub(READ_LEAD_MS))).await;
            let cooldown = store.host(&host).await?.cooldown_until;
            let now = now_ms();
            if let Some(until) = cooldown.filter(|until| *until > now) {
                self.leave(store, permit, None, measures).await;
                return Ok(Err(jittered(until - now)));
            }
            tokio::time::sleep(Duration::from_millis(permit.start.saturating_sub(now))).await;
        }
        // A start missed by more than its interval (the claim took that long) is void: the
        // fetch would bunch with the next ones. The schedule is taken again, once.
        let interval = limits::interval(max_rps, 1.0).unwrap_or(Millis::MAX);
        if now_ms() <= permit.start.saturating_add(interval) {
            return Ok(Ok(permit));
        }
        let schedule = HostLimits {
            max_rps,
            max_inflight: None,
        };
        match self.take(store, &host, schedule, AGAIN_BUDGET).await? {
            Entry::Go(again) => {
                let wait = again.start.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                Ok(Ok(Permit {
                    start: again.start,
                    ..permit
                }))
            }
            Entry::Hold(wait, _) | Entry::Booked { delay: wait, .. } => {
                self.leave(store, permit, None, measures).await;
                Ok(Err(wait))
            }
            Entry::Disallowed => Ok(Ok(permit)),
        }
    }

    /// The schedule is full past the sleep: book the next start (up to 15 minutes ahead),
    /// so the record comes back once, at its turn, rather than asking again and again.
    async fn book<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        ask: Ask,
    ) -> Result<Entry, AwsError> {
        let far = Ask {
            horizon: ask.now + MOST_BOOKED_AHEAD_MS,
            ..ask
        };
        let (grant, state, _) = store.take_host(host, &far, &self.view(host)).await?;
        self.remember(host, state);
        Ok(match grant {
            Grant::StartAt(start) => Entry::Booked {
                start,
                delay: Duration::from_millis(start.saturating_sub(ask.now + BOOKING_LEAD_MS)),
            },
            Grant::Later(start) => Entry::Hold(jittered(start - ask.now), HoldReason::Host),
            Grant::Wait(wait) => Entry::Hold(jittered(wait), HoldReason::Host),
        })
    }

    /// The fetch is over: its slot back and, if the host answered 429 or 503, the cooldown
    /// and slowdown every sandbox then obeys. A failure here is logged: a slot lapses.
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
        let now = now_ms();
        let push_back = match answer {
            Some((429 | 503, retry_after)) => {
                measures.polite.cooldowns.fetch_add(1, ORDER);
                let retry_after = retry_after.map(|d| d.as_millis() as Millis);
                Some(limits::push_back(
                    &self.view(&host),
                    now,
                    max_rps,
                    retry_after,
                ))
            }
            _ => None,
        };
        let mut view = self.view(&host);
        if let Some((slot, _)) = permit.slot
            && let Some(kept) = view.slots.get_mut(slot)
        {
            *kept = None;
        }
        if let Some((until, slowdown)) = push_back {
            view.cooldown_until = Some(until);
            view.slowdown = Some((slowdown, now));
            tracing::info!(
                host = host.as_str(),
                cooldown_ms = until - now,
                slowdown,
                "host pushed back"
            );
        }
        self.remember(&host, view);
        if let Err(err) = store.leave_host(&host, permit.slot, push_back, now).await {
            tracing::warn!(error = %err, host = host.as_str(), "could not give the host's slot back; it lapses");
        }
    }

    /// The host's turn lock of this sandbox.
    fn turn(&self, host: &Host) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if turns.len() >= MOST_HOSTS && !turns.contains_key(host) {
            turns.retain(|_, turn| turn.try_lock().is_err());
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
        let now = now_ms();
        if !store
            .take_robots_fetch(host, now, now + ROBOTS_LEASE_MS)
            .await?
        {
            return Ok(Err(RobotsSays::Wait(jittered(
                ROBOTS_WAIT.as_millis() as Millis
            ))));
        }
        let permit = match self.take(store, host, limits, budget).await? {
            Entry::Go(permit) => permit,
            Entry::Hold(wait, _) => return Ok(Err(RobotsSays::Wait(wait))),
            // The robots.txt fetch does not keep a booking: its lease lapses first.
            Entry::Booked { delay, .. } => return Ok(Err(RobotsSays::Wait(delay))),
            Entry::Disallowed => return Ok(Err(RobotsSays::Disallowed)),
        };
        let permit = match self.ready(store, permit, measures).await? {
            Ok(permit) => permit,
            Err(wait) => return Ok(Err(RobotsSays::Wait(wait))),
        };
        let robots_url = robots::robots_url(url).unwrap_or_default();
        let ask = scraper::Ask::within(budget.min(ROBOTS_TIMEOUT));
        let fetched = fetcher.fetch(&robots_url, ask).await;
        // Metered for the fleet, not charged to a run: one robots.txt serves them all.
        measures.spent(&fetched.spend);
        let fetched = fetched.page;
        measures.polite.robots_fetches.fetch_add(1, ORDER);
        let answer = fetched
            .as_ref()
            .err()
            .and_then(|e| e.http_status.map(|s| (s, e.retry_after)));
        self.leave(store, permit, answer, measures).await;
        let lasts = (
            millis(self.settings.robots_ttl),
            millis(self.settings.robots_retry),
        );
        let record = robots::record_of(&fetched, now_ms(), lasts);
        store.put_robots(host, &record).await?;
        tracing::info!(
            host = host.as_str(),
            rules = record.rules.kind(),
            "robots.txt fetched for the fleet"
        );
        Ok(Ok(record))
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
