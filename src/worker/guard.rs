//! The guard: one read decides whether a delivery has any work left (and a cached read
//! whether its job and run still want it), and a conditional claim makes it this delivery's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::batch::contract::{NotWanted, Outcome};
use crate::domain::blocks::Detection;
use crate::domain::ids::{Id, TaskRef};
use crate::domain::limits::JobPoliteness;
use crate::domain::message::REDRIVE_GAP_MS;
use crate::domain::model::{Counting, Parents, TaskStatus, Tries};
use crate::domain::refresh::Prior;
use crate::ports::error::AwsError;
use crate::ports::tasks::{Claim, Lease, TaskStore, TriesFrom};
use crate::pushback::retry::Patience;

/// What a run's job and run say of its tasks while they want work: how the run counts
/// them, the job's politeness and block detection, and the run's budget for the paid proxy
/// tier.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub counting: Counting,
    pub politeness: JobPoliteness,
    pub detection: Detection,
    pub paid_budget: Option<u64>,
}

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

/// The yes of the parents read (job active, run running, how it counts), kept for a short
/// time per sandbox: at fleet speed every task of a run would read the job's one partition
/// (about 3,000 consistent reads a second at most). Only yes is kept: a run read as missing
/// or not wanted is read again, so a new run is never read as missing; a cancelled run is
/// seen at most `ttl` late (its tasks of those seconds are still counted, not completed).
#[derive(Debug)]
pub struct ParentsCache {
    ttl: Duration,
    runs: Mutex<HashMap<(Id, Id), Arc<Kept>>>,
}

/// A run's kept yes: when it was read, and how the run counts. The lock is held across the
/// read, so the tasks of a run that arrive together make one read, not one each.
type Kept = tokio::sync::Mutex<Option<(Instant, Wanted)>>;

/// Runs kept at once; past it, the expired go (and all, if none has).
const MOST_RUNS: usize = 1024;

impl ParentsCache {
    /// A cache keeping a yes for `ttl` (zero: no cache).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the task's job and run want work, and how the run counts it; at most one read
    /// per run per `ttl` (the tasks arriving meanwhile wait for it).
    pub async fn wanted<S: TaskStore>(
        &self,
        store: &S,
        task: &TaskRef,
    ) -> Result<Result<Wanted, NotWanted>, AwsError> {
        if self.ttl.is_zero() {
            let parents = store.load_parents(task).await?;
            return Ok(unwanted(&parents).map_or(Ok(wanted(&parents)), Err));
        }
        let kept = self.entry(task);
        let mut kept = kept.lock().await;
        if let Some((at, wanted)) = &*kept
            && at.elapsed() < self.ttl
        {
            return Ok(Ok(wanted.clone()));
        }
        let parents = store.load_parents(task).await?;
        if let Some(why) = unwanted(&parents) {
            *kept = None;
            return Ok(Err(why));
        }
        *kept = Some((Instant::now(), wanted(&parents)));
        Ok(Ok(wanted(&parents)))
    }

    /// The run's entry, made if it has none.
    fn entry(&self, task: &TaskRef) -> Arc<Kept> {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        if runs.len() >= MOST_RUNS {
            let ttl = self.ttl;
            runs.retain(|_, kept| {
                kept.try_lock().map_or(true, |k| {
                    k.as_ref().is_some_and(|(at, _)| at.elapsed() < ttl)
                })
            });
            if runs.len() >= MOST_RUNS {
                runs.clear();
            }
        }
        let run = (task.job_id.clone(), task.run_id.clone());
        runs.entry(run).or_default().clone()
    }
}

fn wanted(parents: &Parents) -> Wanted {
    Wanted {
        counting: parents.counting,
        politeness: parents.politeness,
        detection: parents.detection.clone(),
        paid_budget: parents.paid_budget,
    }
}

/// Work is wanted only while the job is `active` and the run `running`.
pub fn unwanted(parents: &Parents) -> Option<NotWanted> {
    match (parents.job_status.as_deref(), parents.run_status.as_deref()) {
        (None, _) => Some(NotWanted::JobMissing),
        (_, None) => Some(NotWanted::RunMissing),
        (Some(job), _) if job != "active" => Some(NotWanted::JobNotActive),
        (_, Some(run)) if run != "running" => Some(NotWanted::RunNotRunning),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parents(job: Option<&str>, run: Option<&str>) -> Parents {
        Parents {
            job_status: job.map(Into::into),
            run_status: run.map(Into::into),
            ..Parents::default()
        }
    }

    #[test]
    fn work_is_wanted_only_for_an_active_job_and_a_running_run() {
        let table = [
            (Some("active"), Some("running"), None),
            (None, Some("running"), Some(NotWanted::JobMissing)),
            (Some("active"), None, Some(NotWanted::RunMissing)),
            (
                Some("cancelled"),
                Some("running"),
                Some(NotWanted::JobNotActive),
            ),
            (
                Some("active"),
                Some("completed"),
                Some(NotWanted::RunNotRunning),
            ),
            (
                Some("active"),
                Some("cancelled"),
                Some(NotWanted::RunNotRunning),
            ),
            (
                Some("active"),
                Some("failed"),
                Some(NotWanted::RunNotRunning),
            ),
        ];
        for (job, run, expected) in table {
            assert_eq!(unwanted(&parents(job, run)), expected, "{job:?} {run:?}");
        }
    }
}
