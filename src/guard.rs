//! The guard: one read decides whether a delivery has any work left, and a conditional claim
//! makes it this delivery's.

use std::time::SystemTime;

use crate::contract::{NotWanted, Outcome};
use crate::domain::ids::TaskRef;
use crate::domain::model::{Parents, TaskStatus};
use crate::retry::Patience;
use crate::store::error::AwsError;
use crate::store::tasks::{Claim, Lease, TaskStore};

/// What the guard lets through.
#[derive(Debug)]
pub enum Admission {
    /// Claimed: scrape `url` and converge. `redelivery` when an earlier delivery had claimed it.
    Admitted {
        url: Option<String>,
        redelivery: bool,
    },
    /// Nothing to do; the outcome says why.
    Skipped(Outcome),
}

/// Reads the task (a terminal task costs this one read and nothing else), then its job and
/// run, then claims it (tried again while a transaction on the task is in flight). Every read
/// is strongly consistent: an answer that leads to an ack must see the latest write.
#[tracing::instrument(skip_all)]
pub async fn admit<S: TaskStore>(
    store: &S,
    task: &TaskRef,
    now: SystemTime,
    lease: Option<Lease<'_>>,
    patience: &Patience<'_>,
) -> Result<Admission, AwsError> {
    let Some(current) = store.load_task(task).await? else {
        return Ok(Admission::Skipped(Outcome::NotWanted(
            NotWanted::TaskMissing,
        )));
    };
    if current.status.is_terminal() {
        return Ok(Admission::Skipped(Outcome::AlreadyTerminal));
    }
    if let Some(why) = unwanted(&store.load_parents(task).await?) {
        return Ok(Admission::Skipped(Outcome::NotWanted(why)));
    }
    Ok(
        match patience.retry(|| store.claim(task, now, lease)).await? {
            Claim::Claimed { attempts, was } => {
                tracing::debug!(attempts, was = was.as_str(), "claimed");
                Admission::Admitted {
                    url: current.url,
                    redelivery: was == TaskStatus::Processing,
                }
            }
            Claim::AlreadyTerminal => Admission::Skipped(Outcome::LostRace),
            Claim::Missing => Admission::Skipped(Outcome::NotWanted(NotWanted::TaskMissing)),
            Claim::Leased { until } => Admission::Skipped(Outcome::LeaseHeld { until }),
        },
    )
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
