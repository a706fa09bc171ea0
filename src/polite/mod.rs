//! Per-host politeness shared by the whole fleet. Each host has a rate limit, an in-flight
//! limit and a cooldown (`domain::limits`, stored in DynamoDB by `store::dynamo::hosts`). Each
//! host also has a robots.txt (`robots`), fetched once per host for all sandboxes.
//! The gate runs after the guard's reads and before the claim. A record whose host has no
//! room is not fetched. It waits instead, and the wait does not use up an attempt. This file
//! holds what a record brings to the gate and what the gate answers. The hosts' schedule,
//! starts and slots are a type of their own ([`Schedule`], in `schedule` and `start`); the
//! fleet's robots.txt is in `fleet_robots`.
//!
//! Every file of the politeness feature: here, `admission.rs` (a wait or a failure),
//! `schedule.rs` (starts, slots, bookings), `start.rs` (the sleep to a start),
//! `fleet_robots.rs` and `robots.rs` (robots.txt); the rules in `domain/limits.rs` (the
//! schedule) and `domain/health.rs` (the adaptive pace); the port `ports/hosts.rs` and its
//! adapter `store/dynamo/hosts/`; in the record's path `worker/admit.rs` (the gate),
//! `worker/fetch/mod.rs` (the start), `worker/hops.rs` (a redirect's turn) and
//! `worker/park.rs` (the parked copy); the operator's `crates/ops/src/hosts.rs`
//! and `bin/conveyor-ops/host.rs`; the settings in `wiring/config.rs`.

mod admission;
mod fleet_robots;
pub mod robots;
mod schedule;
mod start;

pub use admission::{
    Admission, DISALLOWED, MAX_POLITE_HOLD, ROBOTS_PROXY_FAILED, WAITED_TOO_LONG, Waited, admission,
};
use fleet_robots::RobotsSays;
pub use schedule::Schedule;

/// The host limits and their rules live in the domain. They are re-exported here, where the
/// gate uses them.
pub use crate::domain::limits::{self, JobPoliteness};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::domain::limits::{Booker, Host, HostLimits, Millis, PoliteKey, Slot};
use robots::Parsed;

use crate::domain::time::epoch_millis;
use crate::metrics::Measures;
use crate::ports::error::StoreError;
use crate::ports::hosts::HostStore;
use crate::scraper::Fetcher;

/// The fleet's politeness settings (`HOST_MAX_RPS`, `HOST_MAX_INFLIGHT`, `OBEY_ROBOTS`, ...).
#[derive(Debug, Clone)]
pub struct Politeness {
    /// The limits for a host when the job does not set its own.
    pub limits: HostLimits,
    pub obey_robots: bool,
    pub robots_ttl: Duration,
    /// How long a host is held when its robots.txt could not be fetched (5xx, unreachable).
    pub robots_retry: Duration,
    /// The robots.txt fetch's own timeout (`ROBOTS_TIMEOUT_MS`).
    pub robots_timeout: Duration,
    /// The longest wait for a host that is slept inside the invocation. A longer wait is a
    /// hold.
    pub max_sleep: Duration,
    /// The longest total time a task may wait for its host (`POLITE_MAX_WAIT_MS`), counted
    /// from its first wait. After that, the task fails ("waited too long for its host").
    pub max_wait: Duration,
    /// The product token robots.txt groups are matched against.
    pub agent: String,
    /// The paid proxy tier for robots.txt: which tier it is (the last of `PROXY_URLS`; 0:
    /// none), and how many bytes a host's robots.txt may use on it a day
    /// (`ROBOTS_PAID_BUDGET_BYTES`). robots.txt asks the other tiers first.
    pub robots_paid: RobotsPaid,
}

/// The paid tier's share for robots.txt (`Politeness::robots_paid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RobotsPaid {
    pub tier: usize,
    pub budget: u64,
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
            robots_paid: RobotsPaid {
                tier: 0,
                budget: robots::ROBOTS_PAID_BUDGET,
            },
        }
    }
}

/// What the gate reads and writes through: the hosts' items, and the fetcher that fetches
/// robots.txt and resolves a host's address.
#[derive(Debug)]
pub struct GatePorts<'a, S, F> {
    pub store: &'a S,
    pub fetcher: &'a F,
}

impl<S, F> Clone for GatePorts<'_, S, F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S, F> Copy for GatePorts<'_, S, F> {}

/// What the gate says of a record.
#[derive(Debug)]
pub enum Entry {
    /// Fetch now; give the permit back with [`Schedule::leave`].
    Go(Permit),
    /// Not now: come back after this long. The reason is for logs and metrics.
    Hold(Duration, HoldReason),
    /// The host's schedule is full for longer than may be slept. This record's start is
    /// booked at `start`. Come back with the booking after `delay`, a little before the start.
    Booked { start: Millis, delay: Duration },
    /// robots.txt forbids the URL.
    Disallowed,
    /// Our proxy could not fetch the host's robots.txt. This is our failure, not a wait.
    ProxyFailed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// The host's rate, slots or cooldown.
    Host,
    /// The host's robots.txt is being fetched by another sandbox, or could not be fetched.
    Robots,
}

/// A fetch the gate let through: its host, its slot, and the earliest time it may start. The
/// sleep until the start happens in [`Schedule::ready`], after the claim, so the claim's time is
/// not added to the start.
#[derive(Debug, Default)]
pub struct Permit {
    host: Option<(Host, Option<f64>)>,
    slot: Option<Slot>,
    start: Millis,
    /// For a booked start: the limits and the fetch's fetch_time to ask with. The slot is
    /// asked of the host's item at the start, not when the record arrives. The same write
    /// checks the cooldown.
    at_start: Option<(HostLimits, Duration)>,
    /// The latest start the record may be booked for, if its start is missed. `None`: it
    /// books none (on a FIFO queue).
    far: Option<Millis>,
    /// When its start was given (booked). Used to check for slowdowns recorded since then.
    given_at: Millis,
    /// The run the start is for, if it is asked again.
    booker: Option<Booker>,
}

/// A permit given back before its fetch. Come back after `delay`, with the start booked
/// meanwhile, if there is one.
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

/// What a record brings to the gate: its URL, the start a parked copy carries (booked on an
/// earlier delivery), and how much longer it may wait for its host.
#[derive(Debug, Clone, Copy)]
pub struct Visit<'a> {
    pub url: &'a str,
    pub booked: Option<Millis>,
    /// When the start it carries was booked (when the copy was sent).
    pub booked_at: Option<Millis>,
    pub wait_left: Duration,
    /// The task's run, which the starts it books are for.
    pub booker: Option<&'a Booker>,
    /// Whether a start may be booked for it. Not on a FIFO queue: a record there is held in
    /// its message group, and its message cannot carry the booking, so a start it booked
    /// would only be missed.
    pub books: bool,
}

/// The gate, and what this sandbox remembers about hosts between invocations. A host's view
/// is refreshed by every answer from the host's item. A robots.txt is kept until the fleet's
/// copy expires.
#[derive(Debug)]
pub struct Gate {
    settings: Politeness,
    /// The hosts' schedules as this sandbox sees them: starts, slots and bookings.
    pub schedule: Schedule,
    robots: Mutex<HashMap<Host, Arc<KeptRobots>>>,
}

/// The average time, in ms, that the check at a start takes in this sandbox. Each new answer
/// weighs a quarter. The check is made that much ahead of the start, so the fetch starts
/// about on time. It is not made earlier: a check that takes a slot holds it from then on,
/// and a host has few slots.
#[derive(Debug)]
struct CheckTime(AtomicU64);

impl Default for CheckTime {
    fn default() -> Self {
        Self(AtomicU64::new(20))
    }
}

impl CheckTime {
    fn lead(&self) -> Millis {
        self.0.load(ORDER).min(MOST_CHECK_LEAD_MS)
    }

    fn learn(&self, took: Millis) {
        let mean = self.0.load(ORDER);
        self.0
            .store((mean * 3 + took.min(Millis::MAX / 4)) / 4, ORDER);
    }
}

/// A host's turn in this sandbox. Only one request to the host's item runs at a time. It
/// holds the starts booked together, in order, for records of the host that were waiting
/// their turn, and how many such records are waiting now.
#[derive(Debug, Default)]
struct HostTurn {
    /// Starts booked together and not yet given to a record: (the start, when booked).
    spare: tokio::sync::Mutex<VecDeque<(Millis, Millis)>>,
    waiting: AtomicUsize,
}

/// The most starts booked in one write. A batch's records of one host arrive together, so a
/// backlog for a run with one host books one write per ten tasks, not one per task.
const MOST_BOOKED_TOGETHER: usize = 10;

/// A host's robots.txt as this sandbox keeps it, until the fleet's copy expires. The lock is
/// held while it is read or fetched, so all of a sandbox's records of one host wait for a
/// single answer.
type KeptRobots = tokio::sync::Mutex<Option<(Parsed, Millis)>>;

/// The most hosts a sandbox keeps views of. Past this, it forgets them all.
const MOST_HOSTS: usize = 4_096;
/// How long the lease on a fleet-wide robots.txt fetch lasts.
const ROBOTS_LEASE_MS: Millis = 30_000;
/// How long a record waits for another sandbox's robots.txt fetch, reading the fleet's copy
/// this often meanwhile.
const ROBOTS_WAIT: Duration = Duration::from_secs(2);
const ROBOTS_POLL: Duration = Duration::from_millis(250);
/// How long a record waits for a new invocation when it has too little time left to fetch
/// robots.txt.
const ROBOTS_SHORT_WAIT_MS: Millis = 1_000;
/// A slot is held this long past its fetch's fetch_time, to leave time to give it back.
const SLOT_MARGIN_MS: Millis = 5_000;
/// A grant this recent still counts as the host item's answer at the fetch's start. An older
/// grant (the claim took longer) is checked again, so no fetch starts after a push-back
/// recorded since.
const FRESH_GRANT_MS: Millis = 50;
/// The check at a start is made at most this far ahead of it, however slowly the host's item
/// answers. Trouble recorded between the check and the start is missed.
const MOST_CHECK_LEAD_MS: Millis = 100;
/// A start is missed once it is this late, or half an interval late if that is longer.
const LEAST_LATENESS_MS: Millis = 100;
/// At intervals of this many ms or more (5 requests a second or slower), or on a host the
/// fleet has slowed, a start is judged late by when its check ended, even a check slower
/// than usual. At faster rates a slow store would make most checks late, and sending those
/// back to ask again would add to the store's load. So there a start is judged as if its
/// check took its usual time. A slowed host gets fewer requests than its ceiling, and its
/// site has shown it cannot take bursts. A start that waited behind the sandbox's other
/// requests would land on top of the next one.
const JUDGED_AFTER_CHECK_MS: Millis = 200;
/// The most fetch_time used when a missed start is scheduled again. It sleeps at most
/// `POLITE_SLEEP_MAX_MS`.
const AGAIN_TIME: Duration = Duration::from_secs(3);
/// A schedule that runs further ahead than this is checked for an end booked by a run that
/// no longer wants work, which is then given back. A shorter one costs a record at most
/// this long a wait.
const GIVE_BACK_PAST_MS: Millis = 10_000;
/// How long a run read as wanting work is taken to want it, for the check above. A run
/// cancelled meanwhile is seen this late.
const WANTS_WORK_KEPT_MS: Millis = 5_000;
/// A booked record comes back this long before its start and sleeps the rest. SQS delays
/// are whole seconds, and SQS delivers a little late.
const BOOKING_LEAD_MS: Millis = 1_500;

impl Gate {
    pub fn new(settings: Politeness) -> Self {
        Self {
            schedule: Schedule::new(settings.max_sleep),
            settings,
            robots: Mutex::default(),
        }
    }

    /// The job's limits, falling back to the fleet's. A job limit of 0 means no limit.
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

    /// Whether the visit's URL may be fetched now, or else when to come back. A short wait
    /// for the host's schedule is slept later, in [`Schedule::ready`].
    pub async fn enter<S: HostStore, F: Fetcher>(
        &self,
        ports: GatePorts<'_, S, F>,
        visit: Visit<'_>,
        job: &JobPoliteness,
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<Entry, StoreError> {
        let GatePorts { store, fetcher } = ports;
        let parsed = url::Url::parse(visit.url).ok();
        let Some((parsed, host)) = parsed.and_then(|u| Host::of(&u).map(|h| (u, h))) else {
            // The fetcher refuses anything that is not an http(s) URL with a host.
            return Ok(Entry::Go(Permit::default()));
        };
        let mut limits = self.limits(job);
        if job.obey_robots.unwrap_or(self.settings.obey_robots) {
            let says = self.robots(ports, &host, &parsed, limits, fetch_time, measures);
            match says.await? {
                RobotsSays::Fetch { crawl_delay } => limits = limits.with_crawl_delay(crawl_delay),
                RobotsSays::Disallowed => {
                    measures.polite.robots_disallowed.fetch_add(1, ORDER);
                    return Ok(Entry::Disallowed);
                }
                RobotsSays::Wait(wait) => return Ok(Entry::Hold(wait, HoldReason::Robots)),
                RobotsSays::ProxyFailed => return Ok(Entry::ProxyFailed),
            }
        }
        let far = visit.books.then(|| now_ms() + millis(visit.wait_left));
        let key = self.key_of(fetcher, &parsed, host, job.key).await;
        let booked = visit
            .booked
            .map(|start| (start, visit.booked_at.unwrap_or(0)));
        let entry = match booked.and_then(|start| self.booked(&key, limits, start, fetch_time)) {
            Some(entry) => entry,
            None => {
                let booking = (far, visit.booker);
                self.schedule
                    .take(store, &key, limits, fetch_time, booking)
                    .await?
            }
        };
        let booker = visit.booker.cloned();
        Ok(match entry {
            Entry::Go(permit) => Entry::Go(Permit {
                far,
                booker,
                ..permit
            }),
            other => other,
        })
    }

    /// The key the job keeps the URL's politeness limits under: its host, its registrable
    /// domain, or the address it resolves to. It falls back to the host when there is no
    /// registrable domain or the name does not resolve (the fetch then fails on its own).
    /// robots.txt is always per host.
    async fn key_of<F: Fetcher>(
        &self,
        fetcher: &F,
        url: &url::Url,
        host: Host,
        key: PoliteKey,
    ) -> Host {
        match key {
            PoliteKey::Host => host,
            PoliteKey::Domain => Host::domain_of(url).unwrap_or(host),
            PoliteKey::Address => fetcher.address_of(url).await.map_or(host, Host::address),
        }
    }

    /// Whether a copy booked for `start` missed it. A missed booking is void: the fetch
    /// would bunch up with the next starts.
    pub fn missed(&self, start: Millis, job: &JobPoliteness) -> bool {
        missed_at(start, self.limits(job).max_rps, now_ms())
    }

    /// How much longer a copy booked for `start` that came early must wait, without any
    /// request. `None`: it is due.
    pub fn parked(&self, start: Millis) -> Option<Duration> {
        let now = now_ms();
        (start > now + BOOKING_LEAD_MS + millis(self.settings.max_sleep))
            .then(|| Duration::from_millis(start - now - BOOKING_LEAD_MS))
    }

    /// A booked start, checked without a request: come back nearer to it, or go at it. The
    /// slot is asked for at the start, in [`Schedule::ready`]. `None`: the booking was missed and
    /// is void, so the record asks again like any other.
    fn booked(
        &self,
        host: &Host,
        limits: HostLimits,
        (start, given_at): (Millis, Millis),
        fetch_time: Duration,
    ) -> Option<Entry> {
        let now = now_ms();
        if missed_at(start, limits.max_rps, now) {
            return None;
        }
        if let Some(delay) = self.parked(start) {
            return Some(Entry::Booked { start, delay });
        }
        // A cooldown this sandbox already knows of holds the record without a request.
        if let Some(until) = self.schedule.view(host).cooldown_until.filter(|u| *u > now) {
            return Some(Entry::Hold(jittered(until - now), HoldReason::Host));
        }
        Some(Entry::Go(Permit {
            host: Some((host.clone(), limits.max_rps)),
            slot: None,
            start,
            at_start: Some((limits, fetch_time)),
            far: None,
            given_at,
            booker: None,
        }))
    }
}

/// Whether a start is missed at `now`. It is missed when it is later than half an interval
/// at the ceiling `max_rps`, since it would start too close to the next one. At high rates,
/// half an interval can be shorter than the host item's answer time under load, so the
/// bound is never below [`LEAST_LATENESS_MS`].
fn missed_at(start: Millis, max_rps: Option<f64>, now: Millis) -> bool {
    let interval = limits::interval(max_rps, 1.0).unwrap_or(0);
    now > start.saturating_add((interval / 2).max(LEAST_LATENESS_MS))
}

/// Whether a checked start is missed, at the ceiling `max_rps` slowed by `slowdown`. At 5
/// requests a second or slower, or on a slowed host, it is judged at `now`. Otherwise it is
/// judged at `usual`: when the check would have ended had it taken its usual time. It is
/// missed when late by half an interval at the slowed rate (as in `missed_at`).
fn missed_once_checked(
    start: Millis,
    (max_rps, slowdown): (Option<f64>, f64),
    (usual, now): (Millis, Millis),
) -> bool {
    let judged = match limits::interval(max_rps, 1.0) {
        Some(_) if slowdown > 1.0 => now,
        Some(interval) if interval >= JUDGED_AFTER_CHECK_MS => now,
        _ => usual,
    };
    missed_at(start, max_rps.map(|rps| rps / slowdown), judged)
}

/// A wait plus up to a quarter more (jitter), so the records a host held do not all come
/// back at once.
fn jittered(wait: Millis) -> Duration {
    Duration::from_millis(wait.saturating_add(fastrand::u64(0..=wait / 4)))
}

fn now_ms() -> Millis {
    epoch_millis(SystemTime::now()) as Millis
}

/// A duration in milliseconds, saturating at [`Millis::MAX`].
fn millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

const ORDER: std::sync::atomic::Ordering = std::sync::atomic::Ordering::Relaxed;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::limits::HostState;

    #[test]
    fn the_longest_durations_saturate_in_milliseconds_and_in_a_jittered_wait() {
        assert_eq!(millis(Duration::MAX), Millis::MAX);
        assert_eq!(millis(Duration::from_secs(u64::MAX)), Millis::MAX);
        assert_eq!(millis(Duration::from_millis(1_500)), 1_500);
        assert!(jittered(Millis::MAX) >= Duration::from_millis(Millis::MAX));
        assert!(jittered(1_000) <= Duration::from_millis(1_250));
    }

    #[test]
    fn the_check_is_made_ahead_of_the_start_by_its_usual_time_within_the_most() {
        let steady = CheckTime::default();
        let jumpy = CheckTime::default();
        let slow = CheckTime::default();

        for _ in 0..40 {
            steady.learn(10);
            jumpy.learn(10);
            jumpy.learn(90);
            slow.learn(2_000);
        }

        assert!(steady.lead() <= 12, "{}", steady.lead());
        assert!((40..=75).contains(&jumpy.lead()), "{}", jumpy.lead());
        assert_eq!(slow.lead(), MOST_CHECK_LEAD_MS);
    }

    #[test]
    fn a_start_is_slept_for_only_while_the_hosts_usual_answer_still_fits_the_fetchs_time() {
        let schedule = Schedule::new(Duration::from_secs(5));
        let slow_site = HostState {
            answers: Some((1_500.0, 1_400.0)),
            ..HostState::default()
        };
        let limits = HostLimits::none();
        let fetch_time = Duration::from_millis(2_500);

        let unknown = schedule.ask(&HostState::default(), limits, fetch_time);
        let known = schedule.ask(&slow_site, limits, fetch_time);

        assert!((1_450..=1_550).contains(&(unknown.horizon - unknown.now)));
        assert!((950..=1_050).contains(&(known.horizon - known.now)));
    }

    #[test]
    fn a_slow_check_counts_as_lateness_at_5_a_second_or_slower_or_on_a_slowed_host() {
        let (start, usual, slow) = (10_000, 10_020, 10_180);

        assert!(missed_once_checked(start, (Some(5.0), 1.0), (usual, slow)));
        assert!(!missed_once_checked(
            start,
            (Some(20.0), 1.0),
            (usual, slow)
        ));
        assert!(
            missed_once_checked(start, (Some(20.0), 1.0), (slow, slow)),
            "a late claim"
        );
        assert!(
            missed_once_checked(start, (Some(20.0), 1.2), (usual, slow)),
            "the fleet has slowed the host"
        );
        assert!(
            !missed_once_checked(start, (Some(20.0), 1.2), (usual, start + 100)),
            "within half an interval of its pace, at least 100 ms"
        );
        assert!(
            !missed_once_checked(start, (Some(5.0), 2.0), (usual, start + 200)),
            "half an interval at 2.5 a second"
        );
    }

    #[test]
    fn a_start_is_missed_half_an_interval_late_or_100_ms_late_at_high_rates() {
        let start = 10_000;

        assert!(
            !missed_at(start, Some(2.0), start + 250),
            "at 2/s, 250 ms late goes"
        );
        assert!(missed_at(start, Some(2.0), start + 251));
        assert!(
            !missed_at(start, Some(20.0), start + 100),
            "at 20/s, 100 ms late goes"
        );
        assert!(missed_at(start, Some(20.0), start + 101));
        assert!(
            !missed_at(start, None, start + 100),
            "no rate: the same bound"
        );
    }
}
