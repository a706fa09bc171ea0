//! The hosts' port: a host's shared schedule, slots and cooldown, and the fleet's copy of its
//! robots.txt, shared by every sandbox.

use std::future::Future;

use crate::domain::health::Trouble;
use crate::domain::limits::{Ask, Grant, Host, HostState, Millis};
use crate::ports::error::StoreError;

/// What the fleet knows of a host's robots.txt, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RobotsRecord {
    pub rules: Robots,
    pub expires_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Robots {
    /// A robots.txt to obey (its first [`MAX_ROBOTS_BYTES`](crate::domain::limits::MAX_ROBOTS_BYTES)).
    Rules(Vec<u8>),
    /// None there (4xx): everything allowed.
    AllowAll,
    /// The host could not say (5xx, unreachable): nothing allowed until it expires.
    Unavailable,
    /// Our proxy could not fetch it (a 407, a gateway error, no connection): nothing allowed
    /// until it expires, and a failure of ours for the records that meet it. Kept as
    /// `unavailable` with `ours`, which the previous release reads as unavailable.
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

/// A push-back's write: recorded, or refused, with the host's item as it is: a longer
/// cooldown stood, or the slowdown moved since it was read.
#[derive(Debug, Clone, PartialEq)]
pub enum PushedBack {
    Recorded,
    Refused(HostState),
}

/// A take's answer: the grant, the host's state, and the slot taken.
pub type Taken = (Grant, HostState, Option<(usize, Millis)>);

/// The port: a host's schedule and robots.txt, shared by every sandbox.
pub trait HostStore: Send + Sync {
    /// Takes the host's schedule for one fetch, if `decide` grants it on the host as it is
    /// now; answers the grant, the host's state after it (or as it was, if not granted) and
    /// the slot taken (another than asked for, if that one was taken and another free).
    /// `seen`: this sandbox's last view of the host, to guess which condition holds.
    fn take_host(
        &self,
        host: &Host,
        ask: &Ask,
        seen: &HostState,
    ) -> impl Future<Output = Result<Taken, StoreError>> + Send;

    /// The host as it is now (a consistent read).
    fn host(&self, host: &Host) -> impl Future<Output = Result<HostState, StoreError>> + Send;

    /// Gives a fetch's slot back (if it is still the fetch's), in the same write recording
    /// the host's answer times with this fetch's, if it was answered.
    fn leave_host(
        &self,
        host: &Host,
        slot: (usize, Millis),
        answers: Option<(f64, f64)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records the host's trouble computed from `seen` (the item as read): its cooldown
    /// only if it lengthens the one in force (a later, weaker answer never shortens it), and
    /// a drop of the pace (the schedule restarted from it) only while the item's slowdown is
    /// still the one `seen` has (a drop recorded meanwhile is not overwritten: the caller
    /// computes again from the item as refused).
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

    /// Takes the fleet's one fetch of the host's robots.txt until `until`; false when a fresh
    /// one is kept or another sandbox is fetching it.
    fn take_robots_fetch(
        &self,
        host: &Host,
        now: Millis,
        until: Millis,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Stores the fleet's copy; answers it as kept (a file cut to what the item holds), so
    /// the sandbox that fetched it parses the same bytes as every other.
    fn put_robots(
        &self,
        host: &Host,
        record: RobotsRecord,
    ) -> impl Future<Output = Result<RobotsRecord, StoreError>> + Send;
}
