//! The guard: one read decides whether a delivery has any work left (and a cached read
//! whether its job and run still want it), and a conditional claim makes it this delivery's.

use std::time::SystemTime;

use crate::batch::contract::{NotWanted, Outcome};
use crate::domain::ids::TaskRef;
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::{TaskStatus, Tries};
use crate::domain::refresh::Prior;
use crate::ports::error::AwsError;
use crate::ports::tasks::{Claim, Lease, TaskStore, TriesFrom};
use crate::pushback::retry::Patience;

use super::parents::{ParentsCache, Wanted};

/// What the guard's reads let through.
#[derive(Debug)]
pub enum Checked {
    /// Work is wanted: fetch `url` (after the claim), asking whether it changed since
    /// `prior` when the task refreshes an earlier result; `tries`: the task's so far.
    Wanted {
        url: Option<String>,
        prior: Option<Prior>,
        wanted: Wanted,
        tries: Tries,
    },
    /// Nothing to do; the outcome says why.
    Skipped(Outcome),
}

/// What the claim lets through.
#[derive(Debug)]
pub enum Admission {
    /// Claimed: scrape and converge. `redelivery` when an earlier delivery had claimed it;
    /// `attempts`: the task's claims so far, this one included (every fetch follows one,
    /// whatever copies and waits came between); `url`: the task's, as the claim found it.
    Admitted {
        redelivery: bool,
        attempts: u32,
        /// The task's final attempt had failed for a reason of ours (`TaskStore::spend_tries`).
        spent: bool,
        url: Option<String>,
        prior: Option<Prior>,
    },
    /// Nothing to do; the outcome says why.
    Skipped(Outcome),
}

/// Reads the task (a terminal task costs this one read and nothing else), then whether its
/// job and run want work (a cached yes, or a read). Every read is strongly consistent: an
/// answer that leads to an ack must see the latest write.
#[tracing::instrument(skip_all)]
pub async fn check<S: TaskStore>(
    store: &S,
    parents: &ParentsCache,
    task: &TaskRef,
) -> Result<Checked, AwsError> {
    let Some(current) = store.load_task(task).await? else {
        return Ok(Checked::Skipped(Outcome::NotWanted(NotWanted::TaskMissing)));
    };
    if current.status.is_terminal() {
        return Ok(Checked::Skipped(Outcome::AlreadyTerminal));
    }
    Ok(match parents.wanted(store, task).await? {
        Ok(wanted) => Checked::Wanted {
            url: current.url,
            prior: current.prior,
            wanted,
            tries: current.tries,
        },
        Err(why) => Checked::Skipped(Outcome::NotWanted(why)),
    })
}

/// Claims the task for this delivery (tried again while a transaction on the task is in
/// flight). A claim that finds the task's tries begun before this delivery's line (by more
/// than [`REDRIVE_GAP_MS`]: a copy of a redriven message, which waited before its first
/// claim) is made again as the first of a fresh set.
#[tracing::instrument(skip_all)]
pub async fn claim<S: TaskStore>(
    store: &S,
    task: &TaskRef,
    (now, lease, tries): (SystemTime, Option<Lease<'_>>, TriesFrom),
    patience: &Patience<'_>,
) -> Result<Admission, AwsError> {
    let claim = |tries| patience.retry(move || store.claim(task, now, lease, tries));
    let (found, was, url, prior) = match claim(tries).await? {
        Claim::Claimed {
            attempts,
            was,
            url,
            prior,
            tries,
        } => (Tries { attempts, ..tries }, was, url, prior),
        Claim::AlreadyTerminal => return Ok(Admission::Skipped(Outcome::LostRace)),
        Claim::Missing => {
            let missing = Outcome::NotWanted(NotWanted::TaskMissing);
            return Ok(Admission::Skipped(missing));
        }
        Claim::Leased { until } => return Ok(Admission::Skipped(Outcome::LeaseHeld { until })),
    };
    let fresh = !tries.fresh && found.fresh_for(tries.since, REDRIVE_GAP_MS);
    let (attempts, spent) = match fresh {
        true => match claim(TriesFrom { fresh, ..tries }).await? {
            Claim::Claimed { attempts, .. } => (attempts, false),
            _ => (found.attempts, found.spent),
        },
        false => (found.attempts, found.spent && !tries.fresh),
    };
    tracing::debug!(attempts, was = was.as_str(), "claimed");
    Ok(Admission::Admitted {
        redelivery: was == TaskStatus::Processing,
        attempts,
        spent,
        url,
        prior,
    })
}
