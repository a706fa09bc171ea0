//! The spend port: what a delivery spent through proxies, counted once, and the paid tier's
//! budget, reserved in chunks under a sandbox's lease and what was not spent of them given
//! back, by the sandbox or, once its lease expired, by another.

use std::future::Future;

use crate::domain::ids::RunRef;
use crate::domain::ids::TaskRef;
use crate::domain::model::Counting;
use crate::domain::spend::{PaidLease, Reservation, Spend};
use crate::ports::error::StoreError;

/// Where spend is counted and the paid tier's budget kept.
pub trait SpendStore: Send + Sync {
    /// Adds one delivery's spend to the counter item of `task`'s run. `delivery` names the
    /// delivery: the same one recorded twice (a retried request) counts once.
    fn record_spend(
        &self,
        task: &TaskRef,
        counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reserves `chunk` bytes of the run's paid-tier budget under `lease` (its holder's
    /// lease is extended to its expiry), refused once the reserved bytes reach the budget
    /// (then spent, or held elsewhere), or if the run has none.
    fn reserve_paid(
        &self,
        run: RunRef<'_>,
        lease: &PaidLease,
        chunk: u64,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send;

    /// Notes on `holder`'s lease that one of its paid fetches spent `bytes`, so that a lease
    /// taken back after its holder died counts them as spent, not as unspent.
    fn note_paid(
        &self,
        run: RunRef<'_>,
        holder: &str,
        bytes: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Settles `holder`'s lease on the run's paid-tier budget and ends it, as the lease
    /// records it: the bytes it reserved go back to the run but for what was spent, its
    /// noted spend and `unnoted` (spent here, never noted on it), which count as spent. With
    /// no lease (never granted, or taken back), `unnoted` alone is counted as spent.
    fn return_paid(
        &self,
        run: RunRef<'_>,
        holder: &str,
        unnoted: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes back for the run every lease on its paid-tier budget that expired before
    /// `now_ms`: what each noted as spent is spent, the rest is unspent. How many it took.
    fn reclaim_paid(
        &self,
        run: RunRef<'_>,
        now_ms: u64,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;
}
