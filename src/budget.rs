//! The paid proxy tier's budget as one sandbox sees it: chunks of a run's budget reserved
//! from its run item (one write per chunk, not per fetch), spent here.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ids::{Id, TaskRef};
use crate::ports::error::AwsError;
use crate::ports::spend::SpendStore;

/// How long a sandbox takes a refused reservation as the run's answer before asking again
/// (an operator may raise the budget).
const RECHECK: Duration = Duration::from_secs(5);

/// The most runs a sandbox keeps allowances for; past it, the spent ones are let go.
const MOST_RUNS: usize = 1024;

/// The bytes one reservation takes: a 64th of the budget, between 64 KiB and 1 MiB, never
/// more than the budget. What a sandbox reserved and did not spend is lost with it, so the
/// run's paid tier may stop early by that much; it never goes past its budget by more than
/// one chunk and the bodies in flight.
pub fn chunk_of(budget: u64) -> u64 {
    (budget / 64)
        .clamp(64 * 1024, 1024 * 1024)
        .min(budget)
        .max(1)
}

/// This sandbox's share of each run's paid-tier budget.
#[derive(Debug, Default)]
pub struct PaidAllowances {
    runs: Mutex<HashMap<(Id, Id), Allowance>>,
}

#[derive(Debug, Default)]
struct Allowance {
    /// Bytes reserved and not yet spent (below 0: spent past the reservation).
    left: i64,
    /// The run refused a reservation: its budget is spent, until then at least.
    refused_until: Option<Instant>,
}

impl PaidAllowances {
    /// Whether a fetch of `task` may use the paid tier: while this sandbox holds some of the
    /// run's `budget`, or can reserve more of it.
    pub async fn may_use<S: SpendStore>(
        &self,
        store: &S,
        task: &TaskRef,
        budget: u64,
    ) -> Result<bool, AwsError> {
        let run = (task.job_id.clone(), task.run_id.clone());
        if let Some(known) = self.known(&run) {
            return Ok(known);
        }
        let chunk = chunk_of(budget);
        let granted = store.reserve_paid(&run.0, &run.1, chunk).await?;
        let mut runs = self.lock();
        if runs.len() >= MOST_RUNS {
            runs.retain(|_, kept| kept.left > 0);
        }
        let kept = runs.entry(run).or_default();
        if granted {
            kept.left += i64::try_from(chunk).unwrap_or(i64::MAX);
            kept.refused_until = None;
        } else {
            tracing::info!(budget, "the run's paid-tier budget is spent");
            kept.refused_until = Some(Instant::now() + RECHECK);
        }
        Ok(granted)
    }

    /// A fetch of `task` received `bytes` through the paid tier.
    pub fn spent(&self, task: &TaskRef, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let run = (task.job_id.clone(), task.run_id.clone());
        let mut runs = self.lock();
        let kept = runs.entry(run).or_default();
        kept.left = kept
            .left
            .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// What this sandbox already knows: some left (yes), a recent refusal (no), or nothing.
    fn known(&self, run: &(Id, Id)) -> Option<bool> {
        let runs = self.lock();
        let kept = runs.get(run)?;
        if kept.left > 0 {
            return Some(true);
        }
        kept.refused_until
            .filter(|until| Instant::now() < *until)
            .map(|_| false)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Id, Id), Allowance>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_a_64th_of_the_budget_within_its_bounds() {
        assert_eq!(chunk_of(1 << 30), 1024 * 1024);
        assert_eq!(chunk_of(64 * 100 * 1024), 100 * 1024);
        assert_eq!(chunk_of(100 * 1024), 64 * 1024);
        assert_eq!(chunk_of(1000), 1000);
        assert_eq!(chunk_of(0), 1);
    }
}
