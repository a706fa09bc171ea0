//! The hosts port: a host's schedule, slots and cooldown, and the fleet's copy of its
//! robots.txt. Every sandbox shares them.

use std::future::Future;

use crate::domain::health::Trouble;
use crate::domain::limits::{Ask, Booker, Grant, Host, HostState, Millis, Slot, Tail};
use crate::ports::error::StoreError;

/// What the fleet knows of a host's robots.txt, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RobotsRecord {
    pub rules: Robots,
    pub expires_at: Millis,
    /// The fetches that failed in a row before this one's record (0 after a file or a
    /// 4xx): each failure is asked again after a longer gap.
    pub failures: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Robots {
    /// A robots.txt to obey (its first [`MAX_ROBOTS_BYTES`](crate::domain::limits::MAX_ROBOTS_BYTES)).
    Rules(Vec<u8>),
    /// No robots.txt there (4xx): everything is allowed.
    AllowAll,
    /// The host could not serve it (5xx, unreachable): nothing is allowed until it expires.
    Unavailable,
    /// Our proxy could not fetch it (a 407, a gateway error, no connection). Nothing is
    /// allowed until it expires, and the records that meet it count a failure on our side.
    /// Stored as `unavailable` with `ours`, which the previous release reads as unavailable.
    ProxyFailed,
}

impl Robots {
    pub fn kind(&self) -> &'static str {
        match self {
            Robots::Rules(_) => "rules",
            Robots::AllowAll => "allow_all",
            Robots::Unavailable | Robots::ProxyFailed => "unavailable",
        }
    }
}

/// The result of writing a push-back: recorded, or refused with the host's item as it is
/// now. It is refused when a longer cooldown was in force, or the slowdown changed since the
/// item was read.
#[derive(Debug, Clone, PartialEq)]
pub enum PushedBack {
    Recorded,
    Refused(Box<HostState>),
}

/// A take's answer: the grant, the host's state, and the slot taken.
pub type Taken = (Grant, HostState, Option<Slot>);

/// The port: a host's schedule and robots.txt, shared by every sandbox.
pub trait HostStore: Send + Sync {
    /// Takes the host's schedule for one fetch, if `decide` grants it on the host as it is
    /// now. Returns the grant, the host's state after it (or as it was, if not granted), and
    /// the slot taken. That slot differs from the one asked for if that one was taken and
    /// another was free. `seen` is this sandbox's last view of the host, used to guess which
    /// condition holds. A start on the rate's schedule taken for `booker` makes its run the
    /// schedule's tail ([`crate::domain::limits::tail_after`]).
    fn take_host(
        &self,
        host: &Host,
        ask: &Ask,
        seen: &HostState,
        booker: Option<&Booker>,
    ) -> impl Future<Output = Result<Taken, StoreError>> + Send;

    /// Gives the schedule's tail back: the next start moves back to `to`, if `tail` still
    /// ends the schedule as it did. The stretch is marked given back at `now`, so a start in
    /// it that was booked before is void. False when the tail changed meanwhile.
    fn give_back(
        &self,
        host: &Host,
        tail: &Tail,
        to: Millis,
        now: Millis,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether the booker's job is active and its run running (a strongly consistent read).
    fn booker_wants_work(
        &self,
        booker: &Booker,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The host as it is now (a consistent read).
    fn host(&self, host: &Host) -> impl Future<Output = Result<HostState, StoreError>> + Send;

    /// Gives a fetch's slot back, if the fetch still holds it. If the fetch got an answer,
    /// the same write records the host's answer times, this fetch's included.
    fn leave_host(
        &self,
        host: &Host,
        slot: Slot,
        answers: Option<(f64, f64)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records the host's trouble, computed from `seen` (the item as read). The cooldown is
    /// written only if it lengthens the one in force, so a later, weaker answer never
    /// shortens it. A drop of the pace, with the schedule restarted from it, is written only
    /// while the item's slowdown is still the one `seen` has. So a drop recorded meanwhile is
    /// not overwritten. The caller computes again from the item returned with the refusal.
    fn push_back(
        &self,
        host: &Host,
        seen: &HostState,
        trouble: Trouble,
        now: Millis,
    ) -> impl Future<Output = Result<PushedBack, StoreError>> + Send;

    fn robots(
        &self,
        host: &Host,
    ) -> impl Future<Output = Result<Option<RobotsRecord>, StoreError>> + Send;

    /// Claims the fleet's single fetch of the host's robots.txt until `until`. False when a
    /// fresh copy is stored, or another sandbox is fetching it.
    fn take_robots_fetch(
        &self,
        host: &Host,
        now: Millis,
        until: Millis,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Stores the fleet's copy, and returns it as stored (a file cut to what the item
    /// holds). So the sandbox that fetched it parses the same bytes as every other sandbox.
    fn put_robots(
        &self,
        host: &Host,
        record: RobotsRecord,
    ) -> impl Future<Output = Result<RobotsRecord, StoreError>> + Send;

    /// Holds `hold` bytes of the host's paid-tier budget for robots.txt on `day` (UTC,
    /// `YYYY-MM-DD`), if what the day used so far leaves room for them under `budget`
    /// (`hold_of_budget` is the two).
    /// False when it does not. A hold not settled (its sandbox died) stays used until the
    /// day ends.
    fn hold_robots_paid(
        &self,
        host: &Host,
        day: &str,
        hold_of_budget: (u64, u64),
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Ends a hold: `hold_spent` is its bytes, and those the fetch spent of them.
    fn settle_robots_paid(
        &self,
        host: &Host,
        day: &str,
        hold_spent: (u64, u64),
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
