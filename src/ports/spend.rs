//! The spend port: what a delivery spent through proxies, counted once. Also the paid tier's
//! budget. A sandbox reserves it in chunks under its lease. What it did not spend is given
//! back, by the sandbox itself or, once its lease has expired, by another sandbox.

use std::future::Future;

use crate::domain::ids::RunRef;
use crate::domain::ids::TaskRef;
use crate::domain::model::Counting;
use crate::domain::spend::{PaidLease, Reservation, Spend};
use crate::ports::error::StoreError;

/// Where spend is counted and the paid tier's budget kept.
pub trait SpendStore: Send + Sync {
    /// Adds one delivery's spend to the counter item of `task`'s run. `delivery` names the
    /// delivery, so the same delivery recorded twice (a retried request) counts once.
    fn record_spend(
        &self,
        task: &TaskRef,
        counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reserves `chunk` bytes of the run's paid-tier budget under `lease`, and extends the
    /// holder's lease to its expiry. Refused once the reserved bytes reach the budget (spent
    /// by then, or held elsewhere), or if the run has no budget.
    fn reserve_paid(
        &self,
        run: RunRef<'_>,
        lease: &PaidLease,
        chunk: u64,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send;

    /// Notes on `holder`'s lease that the paid fetch of `task`'s `delivery` spent `bytes`, so
    /// that a lease taken back after its holder died counts them as spent, not as unspent.
    /// The same delivery noted twice (a retried request) counts once.
    fn note_paid(
        &self,
        task: &TaskRef,
        holder: &str,
        bytes: u64,
        delivery: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Settles `holder`'s lease on the run's paid-tier budget, as the lease records it, and
    /// ends it. The bytes it reserved go back to the run, except what was spent. Spent means
    /// its noted spend plus `unnoted`: bytes spent here but never noted on the lease. With no
    /// lease (never granted, or taken back), only `unnoted` is counted as spent.
    fn return_paid(
        &self,
        run: RunRef<'_>,
        holder: &str,
        unnoted: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes back for the run every lease on its paid-tier budget that expired before
    /// `now_ms`. What each lease noted as spent counts as spent. The rest goes back as
    /// unspent. Returns how many leases it took back.
    fn reclaim_paid(
        &self,
        run: RunRef<'_>,
        now_ms: u64,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;
}
