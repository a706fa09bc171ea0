//! Stage 4, claim: the delivery makes the task its attempt. Every fetch follows a claim;
//! the task's claims count its attempts across copies and waits. A copy parked for a booked
//! start claims right after its guard instead: its claim is its guard.

use std::time::SystemTime;

use crate::contract::{NotWanted, Outcome};
use crate::domain::ids::TaskRef;
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::{TaskStatus, Tries};
use crate::domain::refresh::Prior;
use crate::ports::tasks::{Claim, Lease, TaskStore, TriesFrom};
use crate::pushback::retry::Patience;

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

/// Claims the task for this delivery, in the set of tries `tries`.
pub(super) async fn take<T: TaskStore>(
    ctx: &Ctx<'_>,
    tasks: &T,
    tries: TriesFrom,
) -> Stage<Claimed> {
    let owner = ctx.delivery.owner.as_deref();
    let lease = owner.map(|owner| Lease {
        owner,
        until: ctx.invocation.deadline,
    });
    let final_attempt = ctx.delivery.counted_receives >= ctx.settings.max_attempts;
    let patience = ctx.patience(final_attempt);
    let ask = ClaimAsk {
        now: SystemTime::now(),
        lease,
        tries,
    };
    claim_task(tasks, ctx.task(), ask, &patience).await
}

/// The claim of a booked copy at its start, made as its guard: a task already terminal
/// ends the record as such, not as a lost race.
pub(super) async fn booked<T: TaskStore>(ctx: &Ctx<'_>, tasks: &T) -> Stage<Claimed> {
    match take(ctx, tasks, ctx.delivery.tries()).await {
        Err(Outcome::LostRace) => Err(Outcome::AlreadyTerminal),
        claimed => claimed,
    }
}

/// What a claim asks of the task: when, a lease if the policy takes one, and its set of
/// tries.
pub struct ClaimAsk<'a> {
    pub now: SystemTime,
    pub lease: Option<Lease<'a>>,
    pub tries: TriesFrom,
}

/// Claims the task, retrying while another transaction on the task is in flight. The claim
/// may find that the task's tries began more than [`REDRIVE_GAP_MS`] before the tries of
/// this delivery's chain of copies. That is a copy of a redriven message, which waited
/// before its first claim. The claim is then made again, as the first of a fresh set.
#[tracing::instrument(name = "claim", skip_all)]
pub async fn claim_task<S: TaskStore>(
    store: &S,
    task: &TaskRef,
    ask: ClaimAsk<'_>,
    patience: &Patience<'_>,
) -> Stage<Claimed> {
    let ClaimAsk { now, lease, tries } = ask;
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
