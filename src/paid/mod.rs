//! The paid proxy tier's budget, as one sandbox sees it. The sandbox reserves chunks of a
//! run's budget from the run's item, under its own lease. That is one write per chunk, not
//! one per fetch. While a paid fetch runs, it earmarks the most bytes its one request may use
//! on the wire (body, headers and TLS; a redirect is a fetch of its own) from those chunks.
//! So concurrent fetches cannot spend more than was reserved. What is left unspent goes
//! back to the run at the end of each invocation. If a sandbox dies before that, the bytes
//! are stuck only until its lease expires. Then another sandbox that finds the budget held
//! takes them back for the run.
//!
//! Every file of the proxies and the paid tier: here (a run's budget); the rules in
//! `domain/proxy.rs` (tiers, credentials, sessions) and `domain/spend.rs` (bytes by tier);
//! the fetch through the tiers in `scraper/route.rs`, `scraper/own_proxies.rs`,
//! `scraper/wire.rs` (bytes on the wire), `scraper/answers.rs` (what a proxy's answer
//! means) and `scraper/egress.rs`; the record's paid leg in `worker/fetch/paid.rs`; the
//! ports `ports/spend.rs` and `ports/secrets.rs` and their adapters `store/dynamo/spend/`
//! and `store/secrets.rs`; the spend counted with the terminal write in
//! `worker/converge/stores.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::domain::ids::RunRef;
use crate::domain::ids::{Id, TaskRef};
use crate::domain::spend::{PaidLease, Reservation};
use crate::ports::error::StoreError;
use crate::ports::spend::SpendStore;

/// How long a sandbox's lease on its reservations lasts after its latest reservation. The
/// sandbox uses them for at most half of this, and a fetch or invocation lasts at most 15
/// minutes. So a lease expires only once its holder is done with it or dead.
pub const LEASE: Duration = Duration::from_secs(30 * 60);

/// The longest time a sandbox treats a refused reservation as the run's answer before
/// asking again. Meanwhile an operator may raise the budget, or another sandbox may give
/// some back. It is never longer than a tenth of the lease.
const RECHECK: Duration = Duration::from_secs(5);

/// A sandbox looks for a run's expired leases (with a Query) at most once per
/// `1 / RECLAIM_EVERY` of a lease: every 3 minutes with the default lease.
const RECLAIM_EVERY: u32 = 10;

/// The most runs a sandbox keeps allowances for. Past this, the spent ones are dropped.
const MOST_RUNS: usize = 1024;

/// How many reservations a paid fetch may make for its earmark before it gives up, when other
/// fetches in this sandbox keep taking what each reservation brought.
const MOST_RESERVATIONS: usize = 3;

/// The bytes one reservation takes: a 64th of the budget, between 64 KiB and 1 MiB, and
/// never more than the budget, but at least one fetch's `cap`. The reserved total exceeds the
/// budget by at most one reservation (the last one granted), so spend never exceeds it by
/// more.
pub fn chunk_of(budget: u64, cap: u64) -> u64 {
    (budget / 64)
        .clamp(64 * 1024, 1024 * 1024)
        .min(budget)
        .max(cap)
        .max(1)
}

/// This sandbox's share of each run's paid-tier budget.
#[derive(Debug)]
pub struct PaidAllowances {
    /// This sandbox's name in its leases.
    holder: String,
    lease: Duration,
    runs: Runs,
    /// One reservation at a time: the fetches waiting for it take from what it brought.
    asking: tokio::sync::Mutex<()>,
}

/// Each run's allowance, shared with the earmarks on it, so an earmark dropped unsettled can
/// end itself.
type Runs = Arc<Mutex<HashMap<(Id, Id), Allowance>>>;

/// What this sandbox knows of its reservations for one run. The lease item is the account's
/// record of them. A give-back settles what the lease says (its reserved bytes and the spend
/// noted on it), plus what this sandbox spent but could not note. It never uses what the
/// sandbox remembers having reserved. So a reservation whose answer was lost is still given
/// back.
#[derive(Debug, Default)]
struct Allowance {
    /// Bytes reserved that are neither earmarked by a fetch nor spent. Below 0: fetches
    /// spent more than their earmarks.
    left: i64,
    /// Until when `left` may be earmarked by new fetches: half the lease after its latest
    /// reservation, so that no fetch outlives the lease.
    usable_until: Option<Instant>,
    /// A reservation was asked for since the last give-back: this sandbox may hold a lease.
    leased: bool,
    /// Bytes spent here that the lease does not know of (a note that failed, a fetch cut
    /// off before it settled), for the give-back to count.
    unnoted: u64,
    /// Paid fetches with an earmark on it now.
    holding: usize,
    /// The run refused a reservation (budget spent, or held elsewhere). It counts as
    /// refused until this time at least.
    refused: Option<(Instant, Reservation)>,
    /// When this sandbox last looked for the run's expired leases.
    reclaimed: Option<Instant>,
}

/// Why a fetch that needed the paid tier did not use it: its run's budget is held by
/// fetches in flight. The record waits for them to settle, as a parked copy, with its try
/// given back.
pub const PAID_BUDGET_BUSY: &str = "the paid tier's budget is held by fetches in flight";

/// The reason a task fails with once it waited `POLITE_MAX_WAIT_MS` (its waits for its host
/// included) and its run's paid budget is still held elsewhere.
pub const WAITED_TOO_LONG_FOR_PAID: &str = "waited too long for the paid budget";

/// How long a record first waits when its run's paid budget is held elsewhere: about the
/// time until this sandbox reads the run's budget again.
pub const PAID_BUDGET_WAIT: Duration = Duration::from_secs(5);

/// The longest a record waits for its run's paid budget at a time.
pub const PAID_BUDGET_MOST_WAIT: Duration = Duration::from_secs(4 * 60);

/// How long a record waits for its run's paid budget, held elsewhere, after `waits` such
/// waits: [`PAID_BUDGET_WAIT`], doubling with each wait up to [`PAID_BUDGET_MOST_WAIT`], of
/// which half to all at random, so records that wait together do not all come back
/// together. Never more than `wait_left`. `None` once nothing is left of the wait: the task
/// then fails.
pub fn paid_wait(waits: u32, wait_left: Duration) -> Option<Duration> {
    if wait_left.is_zero() {
        return None;
    }
    let full = PAID_BUDGET_WAIT
        .saturating_mul(1 << waits.min(16))
        .min(PAID_BUDGET_MOST_WAIT);
    let jittered = full / 2 + full.mul_f64(fastrand::f64() / 2.0);
    Some(jittered.min(wait_left))
}

/// What a paid fetch may do.
#[derive(Debug)]
pub enum PaidAnswer {
    /// Go, with this much of the run's budget reserved.
    Go(PaidEarmark),
    /// The run's budget is spent: the task fails for it.
    Spent,
    /// The whole budget is reserved by fetches in flight (here or elsewhere) or by sandboxes
    /// that have not given back yet. The task tries again later.
    Busy,
}

/// A paid fetch's earmark: `cap` bytes of its run's allowance set aside for it. [`PaidAllowances::settle`]
/// ends it with what the fetch spent. If it is dropped unsettled (its record cut off at the
/// invocation's end), it counts as fully spent, since the fetch may have spent it all.
#[derive(Debug)]
#[must_use = "an earmark is settled with what the fetch spent"]
pub struct PaidEarmark {
    run: (Id, Id),
    /// The task whose fetch it is for.
    task: TaskRef,
    cap: u64,
    runs: Runs,
    settled: bool,
}

impl Drop for PaidEarmark {
    fn drop(&mut self) {
        if !self.settled {
            tracing::warn!(
                cap = self.cap,
                "a paid fetch cut off before it settled counts its whole earmark as spent"
            );
            release(&self.runs, &self.run, (self.cap, self.cap), true);
        }
    }
}

/// Ends an earmark of `cap` bytes, of which `spent` were spent, in memory. `unnoted`: the lease
/// will not be told of the spend.
fn release(runs: &Runs, run: &(Id, Id), (cap, spent): (u64, u64), unnoted: bool) {
    let mut runs = lock(runs);
    let kept = runs.entry(run.clone()).or_default();
    kept.left = kept.left.saturating_add(signed(cap) - signed(spent));
    kept.holding = kept.holding.saturating_sub(1);
    if unnoted {
        kept.unnoted = kept.unnoted.saturating_add(spent);
    }
}

impl Default for PaidAllowances {
    fn default() -> Self {
        Self::new(LEASE)
    }
}

impl PaidAllowances {
    /// A sandbox's allowances, with its reservations leased for `lease` under a random
    /// holder name.
    pub fn new(lease: Duration) -> Self {
        Self {
            holder: format!("{:032x}", fastrand::u128(..)),
            lease,
            runs: Runs::default(),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// An earmark of `cap` bytes for a paid fetch of `task`, taken from what this sandbox has
    /// reserved of the run's `budget`, or can reserve now. Otherwise, the run account's
    /// answer.
    pub async fn earmark<S: SpendStore>(
        &self,
        store: &S,
        task: &TaskRef,
        budget: u64,
        cap: u64,
    ) -> Result<PaidAnswer, StoreError> {
        let run = (task.job_id.clone(), task.run_id.clone());
        let chunk = chunk_of(budget, cap);
        for _ in 0..MOST_RESERVATIONS {
            if let Some(turn) = self.take(task, cap) {
                return Ok(turn);
            }
            let _asking = self.asking.lock().await;
            if let Some(turn) = self.take(task, cap) {
                return Ok(turn);
            }
            let asked = Instant::now();
            let lease = self.lease_from_now();
            let run_ref = RunRef::new(&run.0, &run.1);
            self.asks(&run);
            let mut answer = store.reserve_paid(run_ref, &lease, chunk).await?;
            if answer == Reservation::Held
                && self.reclaims(&run)
                && store.reclaim_paid(run_ref, epoch_ms()).await? > 0
            {
                answer = store.reserve_paid(run_ref, &lease, chunk).await?;
            }
            self.reserved(&run, (chunk, asked), answer, budget);
        }
        Ok(PaidAnswer::Busy)
    }

    /// Takes `cap` from the allowance of `task`'s run if it has that much. Says no if the run
    /// refused recently. Otherwise `None`: a reservation is needed.
    fn take(&self, task: &TaskRef, cap: u64) -> Option<PaidAnswer> {
        let run = (task.job_id.clone(), task.run_id.clone());
        let mut runs = lock(&self.runs);
        let kept = runs.get_mut(&run)?;
        if kept.usable() && kept.left >= signed(cap) {
            kept.left -= signed(cap);
            kept.holding += 1;
            return Some(PaidAnswer::Go(PaidEarmark {
                run,
                task: task.clone(),
                cap,
                runs: self.runs.clone(),
                settled: false,
            }));
        }
        match kept.refused.filter(|(until, _)| Instant::now() < *until)? {
            (_, Reservation::Spent) => Some(PaidAnswer::Spent),
            _ => Some(PaidAnswer::Busy),
        }
    }

    /// This sandbox's lease, from now.
    fn lease_from_now(&self) -> PaidLease {
        let length = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        PaidLease {
            holder: self.holder.clone(),
            expires_at_ms: epoch_ms().saturating_add(length),
        }
    }

    /// Notes, before the reservation is sent, that this sandbox may hold a lease on the run
    /// from now on. Once the reservation went through, its answer may still be lost, or its
    /// record cut off.
    fn asks(&self, run: &(Id, Id)) {
        let mut runs = lock(&self.runs);
        if runs.len() >= MOST_RUNS {
            runs.retain(|_, kept| kept.leased || kept.holding > 0 || kept.unnoted > 0);
        }
        runs.entry(run.clone()).or_default().leased = true;
    }

    /// Whether it is time to look for the run's expired leases (noted as looked for if so).
    fn reclaims(&self, run: &(Id, Id)) -> bool {
        let mut runs = lock(&self.runs);
        let kept = runs.entry(run.clone()).or_default();
        let every = self.lease / RECLAIM_EVERY;
        if kept.reclaimed.is_some_and(|at| at.elapsed() < every) {
            return false;
        }
        kept.reclaimed = Some(Instant::now());
        true
    }

    fn reserved(
        &self,
        run: &(Id, Id),
        (chunk, asked): (u64, Instant),
        answer: Reservation,
        budget: u64,
    ) {
        let mut runs = lock(&self.runs);
        let kept = runs.entry(run.clone()).or_default();
        if answer == Reservation::Granted {
            // What was left after its usable time is not used again, since its lease may
            // have been taken back meanwhile. The give-back settles it from the lease either
            // way.
            if !kept.usable() {
                kept.left = kept.left.min(0);
            }
            kept.left += signed(chunk);
            kept.usable_until = Some(asked + self.lease / 2);
            kept.refused = None;
        } else {
            tracing::info!(
                budget,
                ?answer,
                "the run's paid-tier budget is reserved to the end"
            );
            let recheck = RECHECK.min(self.lease / RECLAIM_EVERY);
            kept.refused = Some((Instant::now() + recheck, answer));
        }
    }

    /// Ends `hold`, an earmark: the fetch of `delivery` spent `bytes` through the paid tier,
    /// and the rest returns to this sandbox. The spend is noted on this sandbox's lease, once
    /// for the delivery. If the note fails, the spend is kept here for the give-back.
    pub async fn settle<S: SpendStore>(
        &self,
        store: &S,
        mut hold: PaidEarmark,
        bytes: u64,
        delivery: &str,
    ) {
        hold.settled = true;
        let noted = store
            .note_paid(&hold.task, &self.holder, bytes, delivery)
            .await;
        if let Err(err) = &noted {
            tracing::warn!(error = %err, bytes, "paid-tier spend not noted on the lease yet");
        }
        release(&self.runs, &hold.run, (hold.cap, bytes), noted.is_err());
    }

    /// Settles and ends this sandbox's lease on each run that no fetch here has an earmark on
    /// now. It runs at the end of an invocation, because a sandbox is frozen or recycled
    /// only between invocations. The run gets back what the lease reserved and was not
    /// spent. A give-back that fails, or is cut short by the deadline, is tried again at the
    /// next one, with the spend it carried.
    pub async fn give_back<S: SpendStore>(&self, store: &S) {
        let due: Vec<((Id, Id), u64)> = {
            let mut runs = lock(&self.runs);
            runs.iter_mut()
                .filter(|(_, kept)| kept.holding == 0 && (kept.leased || kept.unnoted > 0))
                .map(|(run, kept)| {
                    (kept.left, kept.usable_until, kept.leased) = (0, None, false);
                    (run.clone(), std::mem::take(&mut kept.unnoted))
                })
                .collect()
        };
        // Each run's give-back stays owed until its answer says it was settled. One not yet
        // sent when the deadline cuts this short stays owed too.
        let mut owed: Vec<Owed> = due
            .into_iter()
            .map(|(run, unnoted)| Owed {
                runs: self.runs.clone(),
                run,
                unnoted,
                settled: false,
            })
            .collect();
        while let Some(next) = owed.first_mut() {
            let (run_ref, unnoted) = (RunRef::new(&next.run.0, &next.run.1), next.unnoted);
            let answer = store.return_paid(run_ref, &self.holder, unnoted).await;
            match answer {
                Ok(()) => next.settled = true,
                Err(err) => {
                    tracing::warn!(error = %err, unnoted, "paid-tier lease not settled yet")
                }
            }
            owed.remove(0);
        }
    }
}

/// A run's give-back that has not been answered yet. If it is dropped (refused, or cut
/// short), the run is owed a give-back again, with the spend it was to carry.
struct Owed {
    runs: Runs,
    run: (Id, Id),
    unnoted: u64,
    settled: bool,
}

impl Drop for Owed {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut runs = lock(&self.runs);
        let kept = runs.entry(self.run.clone()).or_default();
        kept.leased = true;
        kept.unnoted = kept.unnoted.saturating_add(self.unnoted);
    }
}

impl Allowance {
    fn usable(&self) -> bool {
        self.usable_until
            .is_some_and(|until| Instant::now() < until)
    }
}

fn lock(runs: &Runs) -> std::sync::MutexGuard<'_, HashMap<(Id, Id), Allowance>> {
    runs.lock().unwrap_or_else(PoisonError::into_inner)
}

fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Now, in milliseconds since the epoch (leases are compared across sandboxes' clocks).
fn epoch_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model::Counting;
    use crate::domain::spend::Spend;

    /// A run's account as the run item keeps it: reserved and spent against a budget, and
    /// the sandboxes' leases (holder: reserved, noted spent, expiry).
    struct Account {
        budget: u64,
        /// Reserved, and given back as spent.
        books: Mutex<(u64, u64)>,
        leases: Mutex<HashMap<String, (u64, u64, u64)>>,
        /// Faults to play: reservations applied but answered with an error (a lost
        /// answer), give-backs refused.
        lose_answers: std::sync::atomic::AtomicBool,
        refuse_returns: std::sync::atomic::AtomicBool,
        /// Give-backs that never answer (the deadline cuts them short).
        hang_returns: std::sync::atomic::AtomicBool,
    }

    impl Account {
        fn new(budget: u64) -> Self {
            Self {
                budget,
                books: Mutex::new((0, 0)),
                leases: Mutex::default(),
                lose_answers: false.into(),
                refuse_returns: false.into(),
                hang_returns: false.into(),
            }
        }

        fn fault(flag: &std::sync::atomic::AtomicBool) -> bool {
            flag.load(std::sync::atomic::Ordering::Relaxed)
        }

        fn lost() -> StoreError {
            StoreError::Changed {
                detail: "no answer".into(),
            }
        }

        fn books(&self) -> (u64, u64) {
            *self.books.lock().unwrap_or_else(PoisonError::into_inner)
        }

        fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, u64, u64)>> {
            self.leases.lock().unwrap_or_else(PoisonError::into_inner)
        }

        /// A lease of `reserved` bytes settled, `spent` of them (or more) spent.
        fn settled(&self, (reserved, spent): (u64, u64)) {
            let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
            books.0 = (books.0 + spent).saturating_sub(reserved);
            books.1 += spent;
        }
    }

    impl SpendStore for Account {
        async fn record_spend(
            &self,
            _: &TaskRef,
            _: Counting,
            _: &Spend,
            _: &str,
        ) -> Result<(), StoreError> {
            Ok(())
        }

        async fn reserve_paid(
            &self,
            _: RunRef<'_>,
            lease: &PaidLease,
            chunk: u64,
        ) -> Result<Reservation, StoreError> {
            tokio::task::yield_now().await; // others race in between
            let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
            let answer = match *books {
                (reserved, _) if reserved < self.budget => {
                    books.0 += chunk;
                    let mut leases = self.leases();
                    let held = leases.entry(lease.holder.clone()).or_default();
                    (held.0, held.2) = (held.0 + chunk, lease.expires_at_ms);
                    Reservation::Granted
                }
                (_, spent) if spent < self.budget => Reservation::Held,
                _ => Reservation::Spent,
            };
            match Self::fault(&self.lose_answers) {
                true => Err(Self::lost()),
                false => Ok(answer),
            }
        }

        async fn note_paid(
            &self,
            _: &TaskRef,
            holder: &str,
            bytes: u64,
            _: &str,
        ) -> Result<(), StoreError> {
            match self.leases().get_mut(holder) {
                Some(held) => held.1 += bytes,
                None => {
                    return Err(StoreError::NotAllowed {
                        detail: "no lease".into(),
                    });
                }
            }
            Ok(())
        }

        async fn return_paid(
            &self,
            _: RunRef<'_>,
            holder: &str,
            unnoted: u64,
        ) -> Result<(), StoreError> {
            if Self::fault(&self.refuse_returns) {
                return Err(Self::lost());
            }
            if Self::fault(&self.hang_returns) {
                std::future::pending::<()>().await;
            }
            let (reserved, noted, _) = self.leases().remove(holder).unwrap_or_default();
            self.settled((reserved, noted + unnoted));
            Ok(())
        }

        async fn reclaim_paid(&self, _: RunRef<'_>, now_ms: u64) -> Result<usize, StoreError> {
            let mut leases = self.leases();
            let expired: Vec<String> = leases
                .iter()
                .filter(|(_, held)| held.2 < now_ms)
                .map(|(holder, _)| holder.clone())
                .collect();
            for holder in &expired {
                let (reserved, spent, _) = leases.remove(holder).unwrap_or_default();
                self.settled((reserved, spent));
            }
            Ok(expired.len())
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

        // Act: every fetch that gets an earmark spends all of it.
        let fetches = sandboxes.iter().flat_map(|paid| {
            (0..16).map(|_| async {
                let PaidAnswer::Go(hold) =
                    paid.earmark(&account, &task(), budget, cap).await.unwrap()
                else {
                    return None;
                };
                tokio::task::yield_now().await;
                paid.settle(&account, hold, cap, "d").await;
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
        let PaidAnswer::Go(hold) = first.earmark(&account, &task(), budget, cap).await.unwrap()
        else {
            panic!("an earmark on a fresh budget");
        };
        first.settle(&account, hold, 1_000, "d").await;

        // Act
        first.give_back(&account).await;
        let mut held = 0;
        while let PaidAnswer::Go(hold) = second
            .earmark(&account, &task(), budget, cap)
            .await
            .unwrap()
        {
            second.settle(&account, hold, cap, "d").await;
            held += cap;
        }
        let busy = PaidAllowances::default()
            .earmark(&account, &task(), budget, cap)
            .await;
        second.give_back(&account).await;
        let spent = PaidAllowances::default()
            .earmark(&account, &task(), budget, cap)
            .await;

        // Assert: the second sandbox spent the rest; while it held it, the account said
        // "held", and once given back as spent, "spent".
        assert!(
            held + 1_000 >= budget,
            "{held}: the budget was not stranded"
        );
        assert_eq!(account.books(), (held + 1_000, held + 1_000));
        assert!(matches!(busy.unwrap(), PaidAnswer::Busy));
        assert!(matches!(spent.unwrap(), PaidAnswer::Spent));
    }

    #[tokio::test]
    async fn a_sandbox_that_dies_holding_reservations_strands_them_only_until_its_lease_ends() {
        // Arrange: a budget of two fetches, leases of 200 ms; a sandbox spends 1,000 bytes
        // of one earmark, takes the rest of the budget for a second, and dies in that fetch.
        let (budget, cap, lease) = (128 << 10, 64 << 10, Duration::from_millis(200));
        let account = Account::new(budget);
        let dead = PaidAllowances::new(lease);
        let go = |turn: Result<PaidAnswer, StoreError>| match turn.unwrap() {
            PaidAnswer::Go(hold) => hold,
            turn => panic!("{turn:?}"),
        };
        let first = go(dead.earmark(&account, &task(), budget, cap).await);
        dead.settle(&account, first, 1_000, "d").await;
        let _in_flight = go(dead.earmark(&account, &task(), budget, cap).await);
        let other = PaidAllowances::new(lease);

        // Act: another sandbox asks while the lease lasts, and after.
        let during = other.earmark(&account, &task(), budget, cap).await.unwrap();
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let mut spent = 0;
        while let PaidAnswer::Go(hold) =
            other.earmark(&account, &task(), budget, cap).await.unwrap()
        {
            other.settle(&account, hold, cap, "d").await;
            spent += cap;
        }
        other.give_back(&account).await;

        // Assert: held while the lease lasted; then the rest of the budget was the other's
        // (the dead sandbox's noted 1,000 bytes stay spent, its fetch in flight is the one
        // cap the run may spend past its budget).
        assert!(matches!(during, PaidAnswer::Busy), "{during:?}");
        assert_eq!(spent, budget);
        assert_eq!(account.books(), (spent + 1_000, spent + 1_000));
    }

    fn go(turn: Result<PaidAnswer, StoreError>) -> PaidEarmark {
        match turn {
            Ok(PaidAnswer::Go(hold)) => hold,
            turn => panic!("{turn:?}"),
        }
    }

    #[tokio::test]
    async fn a_reservation_whose_answer_was_lost_is_given_back_all_the_same() {
        // Arrange: the account takes the reservation but its answer never comes back.
        let (budget, cap) = (1 << 20, 64 << 10);
        let account = Account::new(budget);
        let sandbox = PaidAllowances::default();
        account
            .lose_answers
            .store(true, std::sync::atomic::Ordering::Relaxed);

        // Act
        let turn = sandbox.earmark(&account, &task(), budget, cap).await;
        sandbox.give_back(&account).await;

        // Assert: the fetch did not go, and nothing stays reserved.
        assert!(turn.is_err(), "{turn:?}");
        assert_eq!(account.books(), (0, 0));
        assert!(account.leases().is_empty());
    }

    #[tokio::test]
    async fn a_hold_dropped_before_it_settled_counts_as_spent_in_full() {
        // Arrange
        let (budget, cap) = (1 << 20, 64 << 10);
        let account = Account::new(budget);
        let sandbox = PaidAllowances::default();
        let settled = go(sandbox.earmark(&account, &task(), budget, cap).await);
        sandbox.settle(&account, settled, 1_000, "d").await;

        // Act: a fetch cut off with its record at the invocation's end.
        drop(go(sandbox.earmark(&account, &task(), budget, cap).await));
        sandbox.give_back(&account).await;

        // Assert: what may have been spent is spent; the rest of the chunk went back.
        assert_eq!(account.books(), (1_000 + cap, 1_000 + cap));
    }

    #[tokio::test]
    async fn a_give_back_cut_short_by_the_deadline_keeps_the_spend_it_carried() {
        // Arrange: a settled fetch and one cut off before it settled (its whole earmark spent,
        // which the lease does not know of); the account does not answer give-backs.
        let (budget, cap) = (1 << 20, 64 << 10);
        let account = Account::new(budget);
        let sandbox = PaidAllowances::default();
        let settled = go(sandbox.earmark(&account, &task(), budget, cap).await);
        sandbox.settle(&account, settled, 1_000, "d").await;
        drop(go(sandbox.earmark(&account, &task(), budget, cap).await));
        let hang = |on: bool| {
            account
                .hang_returns
                .store(on, std::sync::atomic::Ordering::Relaxed)
        };
        hang(true);

        // Act: the deadline cuts the give-back; the next invocation's goes through.
        let cut = tokio::time::timeout(Duration::from_millis(50), sandbox.give_back(&account));
        assert!(cut.await.is_err(), "cut short");
        hang(false);
        sandbox.give_back(&account).await;

        // Assert: both fetches' spend is counted, the rest of the chunk went back.
        assert_eq!(account.books(), (1_000 + cap, 1_000 + cap));
        assert!(account.leases().is_empty());
    }

    #[tokio::test]
    async fn a_fetch_that_spent_past_its_hold_is_counted_reserved_as_spent() {
        // Arrange
        let (budget, cap) = (1 << 20, 64 << 10);
        let account = Account::new(budget);
        let sandbox = PaidAllowances::default();
        let hold = go(sandbox.earmark(&account, &task(), budget, cap).await);

        // Act: the wire carried more than the earmark (headers, TLS, a relay's read-ahead).
        let chunk = chunk_of(budget, cap);
        sandbox.settle(&account, hold, chunk + 500, "d").await;
        sandbox.give_back(&account).await;

        // Assert
        assert_eq!(account.books(), (chunk + 500, chunk + 500));
    }

    #[tokio::test]
    async fn a_sandbox_whose_lease_was_taken_back_does_not_spend_what_it_had_left() {
        // Arrange: a sandbox reserves a chunk of four fetches, spends a little of one,
        // cannot give back, and sleeps past its lease, which another sandbox takes back.
        let (budget, cap, lease) = (1 << 20, 16 << 10, Duration::from_millis(200));
        let (account, chunk) = (Account::new(budget), chunk_of(budget, cap));
        let sleeper = PaidAllowances::new(lease);
        let hold = go(sleeper.earmark(&account, &task(), budget, cap).await);
        sleeper.settle(&account, hold, 1_000, "d").await;
        let refuse = |on: bool| {
            account
                .refuse_returns
                .store(on, std::sync::atomic::Ordering::Relaxed)
        };
        refuse(true);
        sleeper.give_back(&account).await;
        refuse(false);
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let run_task = task();
        let run = run_task.run();
        assert_eq!(account.reclaim_paid(run, epoch_ms()).await.unwrap(), 1);

        // Act: the sleeper wakes and fetches until it must reserve a second chunk.
        let first = account.books().0;
        let mut holds = 0;
        while account.books().0 <= first + chunk {
            let hold = go(sleeper.earmark(&account, &task(), budget, cap).await);
            sleeper.settle(&account, hold, cap, "d").await;
            holds += 1;
        }
        sleeper.give_back(&account).await;

        // Assert: the chunk it had left before it slept was not used again; every byte
        // spent came from a reservation the account knows of.
        assert_eq!(holds, chunk / cap + 1);
        let (reserved, spent) = account.books();
        assert_eq!((reserved, spent), (spent, 1_000 + holds * cap));
    }

    #[test]
    fn a_wait_for_the_paid_budget_doubles_to_its_most_jittered_and_ends_with_the_wait_left() {
        let day = Duration::from_secs(86_400);
        for _ in 0..100 {
            let first = paid_wait(0, day).unwrap();
            assert!(
                PAID_BUDGET_WAIT / 2 <= first && first <= PAID_BUDGET_WAIT,
                "{first:?}"
            );
            let third = paid_wait(2, day).unwrap();
            assert!(PAID_BUDGET_WAIT * 2 <= third && third <= PAID_BUDGET_WAIT * 4);
            let late = paid_wait(40, day).unwrap();
            assert!(PAID_BUDGET_MOST_WAIT / 2 <= late && late <= PAID_BUDGET_MOST_WAIT);
        }
        let little = Duration::from_millis(300);
        assert_eq!(
            paid_wait(3, little),
            Some(little),
            "never past the wait left"
        );
        assert_eq!(
            paid_wait(0, Duration::ZERO),
            None,
            "waited long enough: fail"
        );
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
