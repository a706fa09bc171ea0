//! The spend port: what a delivery spent through proxies, counted once, and the paid tier's
//! budget, reserved in chunks and what was not spent of them given back.

use std::future::Future;

use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::Counting;
use crate::domain::spend::Spend;
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

    /// Reserves `chunk` bytes of the run's paid-tier budget: `false` once the reserved bytes
    /// reach the budget (or the run has none).
    fn reserve_paid(
        &self,
        job: &Id,
        run: &Id,
        chunk: u64,
    ) -> impl Future<Output = Result<bool, AwsError>> + Send;

    /// Gives `bytes` reserved and not spent back to the run's paid-tier budget.
    fn return_paid(
        &self,
        job: &Id,
        run: &Id,
        bytes: u64,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}
