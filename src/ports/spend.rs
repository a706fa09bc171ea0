//! The spend port: what a delivery spent through proxies, counted once, and the paid tier's
//! budget, reserved in chunks and what was not spent of them given back.

use std::future::Future;

use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::Counting;
use crate::domain::spend::{Reservation, Spend};
use crate::ports::error::AwsError;

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
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// Reserves `chunk` bytes of the run's paid-tier budget, refused once the reserved bytes
    /// reach the budget (then spent, or held elsewhere), or if the run has none.
    fn reserve_paid(
        &self,
        job: &Id,
        run: &Id,
        chunk: u64,
    ) -> impl Future<Output = Result<Reservation, AwsError>> + Send;

    /// Settles a sandbox's reservations of the run's paid-tier budget: `settled` is
    /// (unspent, spent): the unspent bytes go back, the spent are counted as spent.
    fn return_paid(
        &self,
        job: &Id,
        run: &Id,
        settled: (u64, u64),
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}
