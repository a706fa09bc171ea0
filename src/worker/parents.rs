//! Whether a task's job and run still want work: the job is active and the run is running.
//! Each sandbox reads this once per run every few seconds, along with what the job and run
//! say about the run's tasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::contract::NotWanted;
use crate::domain::blocks::Detection;
use crate::domain::ids::{Id, TaskRef};
use crate::domain::limits::JobPoliteness;
use crate::domain::model::{Counting, Parents};
use crate::domain::render::RenderOptions;
use crate::ports::error::StoreError;
use crate::ports::tasks::TaskStore;

/// What a run's job and run say of its tasks while they want work: how the run counts
/// them, the job's politeness and block detection, and the run's budget for the paid proxy
/// tier.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub counting: Counting,
    pub politeness: JobPoliteness,
    pub detection: Detection,
    pub paid_budget: Option<u64>,
    /// How the job's pages are rendered, when the renderer fetches them.
    pub render: RenderOptions,
}

/// A "yes" from the parents read (job active, run running, how the run counts), cached for
/// a short time in each sandbox. Without it, at fleet speed every task of a run would read
/// the job's single partition, which serves about 3,000 consistent reads a second at most.
/// Only a "yes" is cached. A run read as missing or not wanted is read again next time, so
/// a new run is never seen as missing. A cancelled run is seen at most `ttl` late; its
/// tasks in those seconds are still counted, not completed.
#[derive(Debug)]
pub struct ParentsCache {
    ttl: Duration,
    runs: Mutex<HashMap<(Id, Id), Arc<Kept>>>,
}

/// A run's cached "yes": when it was read, and how the run counts. The lock is held across
/// the read, so the tasks of a run that arrive together make one read, not one each.
type Kept = tokio::sync::Mutex<Option<(Instant, Wanted)>>;

/// The most runs cached at once. Past this, expired entries are dropped, or all entries if
/// none has expired.
const MOST_RUNS: usize = 1024;

impl ParentsCache {
    /// A cache that keeps a "yes" for `ttl`. Zero means no cache.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the task's job and run want work, and how the run counts it. At most one read
    /// per run per `ttl`; tasks that arrive during the read wait for it.
    pub async fn wanted<S: TaskStore>(
        &self,
        store: &S,
        task: &TaskRef,
    ) -> Result<Result<Wanted, NotWanted>, StoreError> {
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
        render: parents.render.clone(),
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
