//! The paid proxy tier's budget as one sandbox sees it: chunks of a run's budget reserved
//! from its run item (one write per chunk, not per fetch); each paid fetch holds its most
//! (a body and its hops) of them while it runs, so concurrency cannot spend past what was
//! reserved; and what is left unspent goes back to the run at the end of each invocation, so
//! a sandbox Lambda recycles strands none of it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ids::{Id, TaskRef};
use crate::domain::spend::Reservation;
use crate::ports::error::AwsError;
use crate::ports::spend::SpendStore;

/// How long a sandbox takes a refused reservation as the run's answer before asking again
/// (an operator may raise the budget, another sandbox give some back).
const RECHECK: Duration = Duration::from_secs(5);

/// The most runs a sandbox keeps allowances for; past it, the spent ones are let go.
const MOST_RUNS: usize = 1024;

/// Reservations a paid fetch may make for its hold before it gives up (others in this
/// sandbox took what each one brought).
const MOST_RESERVATIONS: usize = 3;

/// The bytes one reservation takes: a 64th of the budget, between 64 KiB and 1 MiB, never
/// more than the budget, but at least one fetch's `cap`. The reserved total passes the
/// budget by one reservation at most (the last one granted): spend never passes it by more.
pub fn chunk_of(budget: u64, cap: u64) -> u64 {
    (budget / 64)
        .clamp(64 * 1024, 1024 * 1024)
        .min(budget)
        .max(cap)
        .max(1)
}

/// This sandbox's share of each run's paid-tier budget.
#[derive(Debug, Default)]
pub struct PaidAllowances {
    runs: Mutex<HashMap<(Id, Id), Allowance>>,
}

#[derive(Debug, Default)]
struct Allowance {
    /// Bytes reserved, neither held by a fetch nor spent (below 0: spent past its holds).
    left: i64,
    /// Bytes spent here since the last give-back.
    spent: u64,
    /// Paid fetches holding some of it now.
    holding: usize,
    /// The run refused a reservation (spent, or held elsewhere), until then at least.
    refused: Option<(Instant, Reservation)>,
}

/// What a paid fetch may do.
#[derive(Debug)]
pub enum PaidTurn {
    /// Go, holding this much of the run's budget.
    Go(PaidHold),
    /// The run's budget is spent: the task fails for it.
    Spent,
    /// Reserved to the end by fetches in flight (here or elsewhere) or by sandboxes that
    /// have not given back yet: the task tries again later.
    Held,
}

/// A paid fetch's hold on `cap` bytes of its run's allowance; [`PaidAllowances::settle`]
/// ends it with what the fetch spent.
#[derive(Debug)]
#[must_use = "a hold is settled with what the fetch spent"]
pub struct PaidHold {
    run: (Id, Id),
    cap: u64,
}

impl PaidAllowances {
    /// A hold on `cap` bytes for a paid fetch of `task`, from what this sandbox has reserved
    /// of the run's `budget` or can reserve now; else what the run's account says.
    pub async fn hold<S: SpendStore>(
        &self,
        store: &S,
        task: &TaskRef,
        budget: u64,
        cap: u64,
    ) -> Result<PaidTurn, AwsError> {
        let run = (task.job_id.clone(), task.run_id.clone());
        let chunk = chunk_of(budget, cap);
        for _ in 0..MOST_RESERVATIONS {
            if let Some(turn) = self.take(&run, cap) {
                return Ok(turn);
            }
            let answer = store.reserve_paid(&run.0, &run.1, chunk).await?;
            self.reserved(&run, chunk, answer, budget);
        }
        Ok(PaidTurn::Held)
    }

    /// Takes `cap` from the run's allowance if it has that much, says no if the run refused
    /// lately, else `None`: a reservation is needed.
    fn take(&self, run: &(Id, Id), cap: u64) -> Option<PaidTurn> {
        let mut runs = self.lock();
        let kept = runs.get_mut(run)?;
        let most = i64::try_from(cap).unwrap_or(i64::MAX);
        if kept.left >= most {
            kept.left -= most;
            kept.holding += 1;
            let run = run.clone();
            return Some(PaidTurn::Go(PaidHold { run, cap }));
        }
        match kept.refused.filter(|(until, _)| Instant::now() < *until)? {
            (_, Reservation::Spent) => Some(PaidTurn::Spent),
            _ => Some(PaidTurn::Held),
        }
    }

    fn reserved(&self, run: &(Id, Id), chunk: u64, answer: Reservation, budget: u64) {
        let mut runs = self.lock();
        if runs.len() >= MOST_RUNS {
            runs.retain(|_, kept| kept.left != 0 || kept.holding > 0 || kept.spent > 0);
        }
        let kept = runs.entry(run.clone()).or_default();
        if answer == Reservation::Granted {
            kept.left += i64::try_from(chunk).unwrap_or(i64::MAX);
            kept.refused = None;
        } else {
            tracing::info!(
                budget,
                ?answer,
                "the run's paid-tier budget is reserved to the end"
            );
            kept.refused = Some((Instant::now() + RECHECK, answer));
        }
    }

    /// Ends `hold`: the fetch spent `bytes` through the paid tier; the rest of its hold is
    /// this sandbox's again.
    pub fn settle(&self, hold: PaidHold, bytes: u64) {
        let unspent =
            i64::try_from(hold.cap).unwrap_or(i64::MAX) - i64::try_from(bytes).unwrap_or(i64::MAX);
        let mut runs = self.lock();
        let kept = runs.entry(hold.run).or_default();
        kept.left = kept.left.saturating_add(unspent);
        kept.spent = kept.spent.saturating_add(bytes);
        kept.holding = kept.holding.saturating_sub(1);
    }

    /// Gives what this sandbox reserved and did not spend back to each run no fetch here
    /// holds any of now (at the end of an invocation: a sandbox is frozen or recycled only
    /// between them). A give-back that fails is kept here for the next.
    pub async fn give_back<S: SpendStore>(&self, store: &S) {
        let settled: Vec<((Id, Id), (u64, u64))> = {
            let mut runs = self.lock();
            runs.iter_mut()
                .filter(|(_, kept)| kept.holding == 0 && (kept.left > 0 || kept.spent > 0))
                .map(|(run, kept)| {
                    let unspent = u64::try_from(std::mem::take(&mut kept.left)).unwrap_or(0);
                    (run.clone(), (unspent, std::mem::take(&mut kept.spent)))
                })
                .collect()
        };
        for (run, (unspent, spent)) in settled {
            if let Err(err) = store.return_paid(&run.0, &run.1, (unspent, spent)).await {
                tracing::warn!(error = %err, unspent, "paid-tier bytes not settled yet");
                let mut runs = self.lock();
                let kept = runs.entry(run).or_default();
                kept.left = kept
                    .left
                    .saturating_add(i64::try_from(unspent).unwrap_or(i64::MAX));
                kept.spent = kept.spent.saturating_add(spent);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Id, Id), Allowance>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model::Counting;
    use crate::domain::spend::Spend;

    /// A run's account as the run item keeps it: reserved and spent against a budget.
    struct Account {
        budget: u64,
        /// Reserved, and given back as spent.
        books: Mutex<(u64, u64)>,
    }

    impl Account {
        fn new(budget: u64) -> Self {
            Self {
                budget,
                books: Mutex::new((0, 0)),
            }
        }

        fn books(&self) -> (u64, u64) {
            *self.books.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl SpendStore for Account {
        async fn record_spend(
            &self,
            _: &TaskRef,
            _: Counting,
            _: &Spend,
            _: &str,
        ) -> Result<(), AwsError> {
            Ok(())
        }

        async fn reserve_paid(&self, _: &Id, _: &Id, chunk: u64) -> Result<Reservation, AwsError> {
            tokio::task::yield_now().await; // others race in between
            let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
            Ok(match *books {
                (reserved, _) if reserved < self.budget => {
                    books.0 += chunk;
                    Reservation::Granted
                }
                (_, spent) if spent < self.budget => Reservation::Held,
                _ => Reservation::Spent,
            })
        }

        async fn return_paid(
            &self,
            _: &Id,
            _: &Id,
            (unspent, spent): (u64, u64),
        ) -> Result<(), AwsError> {
            let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
            books.0 = books.0.saturating_sub(unspent);
            books.1 += spent;
            Ok(())
        }
    }

    fn task() -> TaskRef {
        TaskRef::new(
            Id::parse("j").unwrap(),
            Id::parse("r").unwrap(),
            Id::parse("t").unwrap(),
        )
    }

    #[tokio::test]
    async fn fetches_racing_for_the_last_of_a_budget_spend_no_more_than_one_reservation_past_it() {
        // Arrange: a budget of 1 MiB, fetches of at most 100 KiB each, 8 sandboxes of 16.
        let (budget, cap) = (1 << 20, 100 << 10);
        let account = Account::new(budget);
        let sandboxes: Vec<PaidAllowances> = (0..8).map(|_| PaidAllowances::default()).collect();

        // Act: every fetch that gets a hold spends all of it.
        let fetches = sandboxes.iter().flat_map(|paid| {
            (0..16).map(|_| async {
                let PaidTurn::Go(hold) = paid.hold(&account, &task(), budget, cap).await.unwrap()
                else {
                    return None;
                };
                tokio::task::yield_now().await;
                paid.settle(hold, cap);
                Some(cap)
            })
        });
        let spent: u64 = futures_util::future::join_all(fetches)
            .await
            .into_iter()
            .flatten()
            .sum();

        // Assert
        assert!(spent > 0);
        assert!(spent <= budget + chunk_of(budget, cap), "{spent}");
    }

    #[tokio::test]
    async fn what_a_sandbox_did_not_spend_goes_back_and_another_spends_it() {
        // Arrange: one sandbox reserves, spends a little, and is done with its invocation.
        let (budget, cap) = (300 << 10, 64 << 10);
        let account = Account::new(budget);
        let (first, second) = (PaidAllowances::default(), PaidAllowances::default());
        let PaidTurn::Go(hold) = first.hold(&account, &task(), budget, cap).await.unwrap() else {
            panic!("a hold on a fresh budget");
        };
        first.settle(hold, 1_000);

        // Act
        first.give_back(&account).await;
        let mut held = 0;
        while let PaidTurn::Go(hold) = second.hold(&account, &task(), budget, cap).await.unwrap() {
            second.settle(hold, cap);
            held += cap;
        }
        let busy = PaidAllowances::default()
            .hold(&account, &task(), budget, cap)
            .await;
        second.give_back(&account).await;
        let spent = PaidAllowances::default()
            .hold(&account, &task(), budget, cap)
            .await;

        // Assert: the second sandbox spent the rest; while it held it, the account said
        // "held", and once given back as spent, "spent".
        assert!(
            held + 1_000 >= budget,
            "{held}: the budget was not stranded"
        );
        assert_eq!(account.books(), (held + 1_000, held + 1_000));
        assert!(matches!(busy.unwrap(), PaidTurn::Held));
        assert!(matches!(spent.unwrap(), PaidTurn::Spent));
    }

    #[test]
    fn a_chunk_is_a_64th_of_the_budget_within_its_bounds_and_holds_one_fetch() {
        assert_eq!(chunk_of(1 << 30, 1), 1024 * 1024);
        assert_eq!(chunk_of(64 * 100 * 1024, 1), 100 * 1024);
        assert_eq!(chunk_of(100 * 1024, 1), 64 * 1024);
        assert_eq!(chunk_of(1000, 1), 1000);
        assert_eq!(chunk_of(0, 0), 1);
        assert_eq!(chunk_of(1 << 30, 10 << 20), 10 << 20, "a fetch's most");
    }
}
