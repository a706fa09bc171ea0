//! One record, start to end: parse, guard, scrape, converge; the answer is an [`Outcome`].

use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use tokio::time::Instant;

use crate::batch::Invocation;
use crate::config::{Config, DuplicatePolicy};
use crate::contract::Outcome;
use crate::converge::{self, Converged};
use crate::error::StoreError;
use crate::guard::{self, Admission};
use crate::ids::{QuarantineKey, ResultKey, TaskRef};
use crate::message::{self, Poison};
use crate::model::Failure;
use crate::result_store::ResultStore;
use crate::scraper::{FetchError, Fetcher, Retry};
use crate::task_store::{Lease, TaskStore, rfc3339};
use crate::visibility::{Backoff, QueueRef, Visibility};

/// The settings one record needs, from [`Config`].
#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub results_prefix: String,
    pub quarantine_prefix: String,
    pub max_attempts: u32,
    pub scrape_timeout: Duration,
    pub backoff: Backoff,
    pub duplicate_policy: DuplicatePolicy,
}

impl From<&Config> for RecordSettings {
    fn from(config: &Config) -> Self {
        Self {
            results_prefix: config.results_prefix.clone(),
            quarantine_prefix: config.quarantine_prefix.clone(),
            max_attempts: config.max_attempts,
            scrape_timeout: config.scrape_timeout,
            backoff: config.into(),
            duplicate_policy: config.duplicate_policy,
        }
    }
}

/// The worker's ports and settings, built once per cold start.
#[derive(Debug, Clone)]
pub struct Worker<T, R, F, V> {
    pub tasks: T,
    pub results: R,
    pub fetcher: F,
    pub visibility: V,
    pub settings: RecordSettings,
}

impl<T: TaskStore, R: ResultStore, F: Fetcher, V: Visibility> Worker<T, R, F, V> {
    /// Processes one record within the invocation. Never fails: every end is an outcome.
    pub async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let task = match message::parse_body(record.body.as_deref()) {
            Ok(task) => task,
            Err(poison) => return self.quarantine(record, poison).await,
        };
        let span = tracing::Span::current();
        span.record("job_id", task.job_id.as_str());
        span.record("run_id", task.run_id.as_str());
        span.record("task_id", task.task_id.as_str());
        let receives = receive_count(record);
        let final_attempt = receives >= self.settings.max_attempts;
        let outcome = self
            .process_task(&task, final_attempt, invocation, record)
            .await
            .unwrap_or_else(Outcome::Store);
        match &outcome {
            Outcome::ScrapeTransient { retry_after, .. } => {
                self.hold_back(record, *retry_after, receives).await;
            }
            Outcome::LeaseHeld { until } => {
                // Back exactly when the lease ends (not capped by the backoff's maximum:
                // coming back earlier would only find the lease again and burn a receive).
                let left = until.duration_since(SystemTime::now()).unwrap_or_default();
                self.hold(record, left + Duration::from_secs(1)).await;
            }
            _ => {}
        }
        outcome
    }

    /// Keeps a poison message in S3 before it is acknowledged; if that fails, it is retried
    /// rather than lost.
    async fn quarantine(&self, record: &SqsMessage, poison: Poison) -> Outcome {
        let message_id = record.message_id.as_deref().unwrap_or_default();
        let key = QuarantineKey::for_message(&self.settings.quarantine_prefix, message_id);
        let document = serde_json::json!({
            "reason": poison.0,
            "quarantined_at": rfc3339(SystemTime::now()),
            "record": record,
        });
        // Serialising a JSON value into a Vec cannot fail.
        let document = serde_json::to_vec_pretty(&document).unwrap_or_default();
        match self.results.quarantine(&key, document).await {
            Ok(()) => Outcome::Poison(poison),
            Err(err) => Outcome::Store(err),
        }
    }

    /// Keeps a transiently failed message invisible until its retry is due. If that fails,
    /// the message still comes back, after the queue's own visibility timeout.
    async fn hold_back(&self, record: &SqsMessage, retry_after: Option<Duration>, receives: u32) {
        let delay = self.settings.backoff.delay(retry_after, receives);
        self.hold(record, delay).await;
    }

    async fn hold(&self, record: &SqsMessage, delay: Duration) {
        let queue = record
            .event_source_arn
            .as_deref()
            .and_then(QueueRef::from_arn);
        let (Some(queue), Some(handle)) = (queue, record.receipt_handle.as_deref()) else {
            tracing::warn!("no queue ARN or receipt handle: redelivery after the queue's timeout");
            return;
        };
        match self.visibility.hold(&queue, handle, delay).await {
            Ok(()) => tracing::info!(delay_ms = delay.as_millis() as u64, "held back for retry"),
            Err(err) => {
                tracing::warn!(error = %err, "could not hold back; redelivery after the queue's timeout")
            }
        }
    }

    async fn process_task(
        &self,
        task: &TaskRef,
        final_attempt: bool,
        invocation: &Invocation,
        record: &SqsMessage,
    ) -> Result<Outcome, StoreError> {
        // The owner is this delivery: the invocation's request id and the message id, so two
        // copies of a task in one batch do not share a lease either.
        let owner = match self.settings.duplicate_policy {
            DuplicatePolicy::Converge => None,
            DuplicatePolicy::Lease => Some(format!(
                "{}/{}",
                invocation.request_id,
                record.message_id.as_deref().unwrap_or_default()
            )),
        };
        let lease = owner.as_deref().map(|owner| Lease {
            owner,
            until: invocation.deadline,
        });
        let admitted = guard::admit(&self.tasks, task, SystemTime::now(), lease).await?;
        let (url, redelivery) = match admitted {
            Admission::Admitted { url, redelivery } => (url, redelivery),
            Admission::Skipped(outcome) => return Ok(outcome),
        };
        let key = ResultKey::for_task(&self.settings.results_prefix, task);
        let budget = self
            .settings
            .scrape_timeout
            .min(invocation.cutoff.saturating_duration_since(Instant::now()));
        let fetched = match url {
            Some(url) => {
                let started = Instant::now();
                let fetched = self.fetcher.fetch(&url, budget).await;
                invocation.measures.fetched(started.elapsed());
                fetched
            }
            None => Err(FetchError::permanent("task has no url")),
        };
        let (converged, gave_up) = match fetched {
            Ok(page) => {
                let converged = converge::succeed(&self.tasks, &self.results, task, &key, &page);
                let converged = converged.await?;
                if converged == (Converged::Succeeded { adopted: false }) {
                    invocation.measures.stored(page.body.len() as u64);
                }
                (converged, false)
            }
            Err(err) if err.retry == Retry::Transient && !final_attempt => {
                return Ok(Outcome::ScrapeTransient {
                    reason: err.reason,
                    retry_after: err.retry_after,
                });
            }
            Err(err) => {
                let failure = Failure {
                    reason: err.reason,
                    http_status: err.http_status,
                };
                let converged = converge::fail(&self.tasks, &self.results, task, &key, failure);
                (converged.await?, err.retry == Retry::Transient)
            }
        };
        Ok(match converged {
            Converged::Succeeded { adopted } => Outcome::Succeeded {
                redelivery,
                adopted,
            },
            Converged::LostRace => Outcome::LostRace,
            Converged::Failed { reason } if gave_up => Outcome::GaveUp { reason },
            Converged::Failed { reason } => Outcome::FailedPermanently { reason },
        })
    }
}

/// SQS's `ApproximateReceiveCount`: 1 on the first delivery. Missing or odd values count as 1.
fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}
