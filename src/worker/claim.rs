//! Stage 4, claim: the delivery makes the task its attempt. Every fetch follows a claim;
//! the task's claims count its attempts across copies and waits. A copy parked for a booked
//! start claims right after its guard instead: its claim is its guard.

use std::time::SystemTime;

use crate::contract::{NotWanted, Outcome};
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::{TaskStatus, Tries};
use crate::domain::refresh::Prior;
use crate::ports::tasks::{Claim, Lease, TaskStore, TriesFrom};

use super::context::{Ctx, Stage};

/// A claim this delivery made: its try of the task.
#[derive(Debug)]
pub struct Claimed {
    /// An earlier delivery had claimed the task.
    pub redelivery: bool,
    /// The task's claims so far, this one included: every fetch follows one, whatever
    /// copies and waits came between.
    pub attempts: u32,
    /// The task's final attempt had failed for a reason on our side
    /// (`TaskStore::spend_tries`).
    pub spent: bool,
    /// The task's URL and earlier result, as the claim found them.
    pub url: Option<String>,
    pub prior: Option<Prior>,
    /// The lease's owner, if the claim took one (`DUPLICATE_POLICY=lease`).
    pub owner: Option<String>,
}

/// The claim of a booked copy at its start, made as its guard: a task already terminal
/// ends the record as such, not as a lost race.
pub(super) async fn booked<T: TaskStore>(ctx: &Ctx<'_>, tasks: &T) -> Stage<Claimed> {
    match take(ctx, tasks, ctx.delivery.tries()).await {
        Err(Outcome::LostRace) => Err(Outcome::AlreadyTerminal),
        claimed => claimed,
    }
}

/// Claims the task for this delivery, in the set of tries `tries`, retrying while another
/// transaction on the task is in flight. Under `DUPLICATE_POLICY=lease` the claim takes the
/// task's lease until the invocation's deadline. The claim may find that the task's tries
/// began more than [`REDRIVE_GAP_MS`] before the tries of this delivery's chain of copies.
/// That is a copy of a redriven message, which waited before its first claim. The claim is
/// then made again, as the first of a fresh set.
#[tracing::instrument(name = "claim", skip_all)]
pub(super) async fn take<T: TaskStore>(
    ctx: &Ctx<'_>,
    store: &T,
    tries: TriesFrom,
) -> Stage<Claimed> {
    let (task, now) = (ctx.task(), SystemTime::now());
    let until = ctx.invocation.deadline;
    let lease = (ctx.delivery.owner.as_deref()).map(|owner| Lease { owner, until });
    let final_attempt = ctx.delivery.counted_receives >= ctx.settings.max_attempts;
    let patience = ctx.patience(final_attempt);
    let owner = lease.map(|lease| lease.owner.to_owned());
    let claim = |tries| patience.retry(move || store.claim(task, now, lease, tries));
    let (found, was, url, prior) = match claim(tries).await? {
        Claim::Claimed {
            attempts,
            was,
            url,
            prior,
            tries,
        } => (Tries { attempts, ..tries }, was, url, prior),
        Claim::AlreadyTerminal => return Err(Outcome::LostRace),
        Claim::Missing => return Err(Outcome::NotWanted(NotWanted::TaskMissing)),
        Claim::Leased { until } => return Err(Outcome::Leased { until }),
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
    Ok(Claimed {
        redelivery: was == TaskStatus::Processing,
        attempts,
        spent,
        url,
        prior,
        owner,
    })
}
