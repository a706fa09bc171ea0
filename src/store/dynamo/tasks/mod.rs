//! The task store's DynamoDB adapter (`ports::tasks::TaskStore`): the guard's reads, the claim
//! and its lease, the terminal write (counted by `run_counters` or `shards`), and the task
//! item's write expressions (`writes`).

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
};

use crate::domain::bounds::Reason;
use crate::domain::ids::{Id, TaskRef};
use crate::domain::model::{Counting, Parents, Task, TaskStatus, Terminal};
use crate::domain::model::{Lease, Tries, TriesFrom};
use crate::domain::refresh::{Prior, Validators};
use crate::domain::spend::CountedIn;
use crate::domain::time::{millis_of_rfc3339, rfc3339};
use crate::ports::error::StoreError;
use crate::ports::tasks::{Claim, Finish, TaskStore};
use crate::store::dynamo::attributes::{Item, number, string};
use crate::store::dynamo::run_counters;
use crate::store::dynamo::shards;
use crate::store::dynamo::{DynamoTaskStore, is_condition_failure};
use crate::store::dynamo::{jobs, keys};
use terminal::finish_uncounted;
use writes::Over;

impl TaskStore for DynamoTaskStore {
    #[tracing::instrument(skip_all)]
    async fn load_task(&self, task: &TaskRef) -> Result<Option<Task>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(keys::task_key(task)))
            // Strongly consistent. A task written just before its message was sent, or
            // re-queued just now, must never read as missing or terminal: that would ack it.
            .consistent_read(true)
            .projection_expression(
                "#status, #url, prior_result_key, prior_sha256, prior_etag, prior_last_modified, \
                 attempts, tries_since, tries_spent, updated_at, render",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#url", "url")
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetItem", e))?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        Ok(Some(Task {
            status: status_of(&item)?,
            url: string(&item, "url").map(str::to_owned),
            prior: prior_of(&item),
            tries: tries_of(&item),
            render: jobs::render_word(&item, "render"),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn load_parents(&self, task: &TaskRef) -> Result<Parents, StoreError> {
        parents_of(self, &task.job_id, &task.run_id).await
    }

    #[tracing::instrument(skip_all, fields(lease = lease.is_some()))]
    async fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
        tries: TriesFrom,
    ) -> Result<Claim, StoreError> {
        let result = self
            .update_task(task, writes::claim(now, lease, tries))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let old = out.attributes.unwrap_or_default();
                let counted = if tries.fresh {
                    0
                } else {
                    number(&old, "attempts").unwrap_or(0)
                };
                let attempts = counted + 1;
                let was = status_of(&old)?;
                let url = string(&old, "url").map(str::to_owned);
                let prior = prior_of(&old);
                Ok(Claim::Claimed {
                    attempts,
                    was,
                    url,
                    prior,
                    tries: tries_of(&old),
                })
            }
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => {
                    claim_refused(e.item())
                }
                _ => Err(StoreError::from_sdk("UpdateItem(claim)", err)),
            },
        }
    }

    #[tracing::instrument(skip_all)]
    async fn unclaim(
        &self,
        task: &TaskRef,
        was: TaskStatus,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        let result = self
            .update_task(task, writes::unclaim(was, owner))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(unclaim)", err)),
        }
    }

    async fn spend_tries(&self, task: &TaskRef, reason: &Reason) -> Result<(), StoreError> {
        let result = self
            .update_task(task, writes::spend_tries(reason))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(spend_tries)", err)),
        }
    }

    async fn release(&self, task: &TaskRef, owner: &str) -> Result<(), StoreError> {
        let result = self.update_task(task, writes::release(owner)).send().await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(release)", err)),
        }
    }

    /// Counts the task into its run in the same transaction as the terminal write, so a
    /// task is counted exactly once. While more than one task remains, that is one
    /// transaction. The last task's transaction also completes the run, since only one can
    /// take `tasks_remaining` from 1 to 0. A run that is not running counts the task but is
    /// not completed. A run with no counters does not count it at all. A success that finds
    /// the task failed without a result replaces that failure, and moves the run's count
    /// along.
    #[tracing::instrument(
        name = "terminal_write",
        skip_all,
        fields(status = terminal.status().as_str())
    )]
    async fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        counted: CountedIn<'_>,
        now: SystemTime,
    ) -> Result<Finish, StoreError> {
        let CountedIn { counting, spend } = counted;
        let now = rfc3339(now);
        if let Counting::Shards(sharding) = counting {
            return shards::finish_sharded(self, task, (terminal, spend), &now, sharding).await;
        }
        if let Some(finished) =
            run_counters::finish_on_run(self, task, (terminal, spend), &now).await?
        {
            return Ok(finished);
        }
        tracing::warn!("the run is gone or has no counters: the task is finished uncounted");
        finish_uncounted(self, task, terminal, &now, Over::Open).await
    }
}

/// The task's set of tries, as its item keeps it.
fn tries_of(item: &Item) -> Tries {
    Tries {
        attempts: number(item, "attempts").unwrap_or(0),
        since: number(item, "tries_since"),
        spent: item.contains_key("tries_spent"),
        written: string(item, "updated_at").and_then(millis_of_rfc3339),
    }
}

/// A claim's refusal, by the item as it was: gone, terminal, or leased by another delivery.
fn claim_refused(item: Option<&Item>) -> Result<Claim, StoreError> {
    let Some(item) = item.filter(|item| !item.is_empty()) else {
        return Ok(Claim::Missing);
    };
    if status_of(item)?.is_terminal() {
        return Ok(Claim::AlreadyTerminal);
    }
    let until = number::<u64>(item, "lease_until").unwrap_or_default();
    Ok(Claim::Leased {
        until: SystemTime::UNIX_EPOCH + Duration::from_millis(until),
    })
}

/// A refresh task's earlier result, as its producer wrote it (`prior_*`), if whole and valid.
fn prior_of(item: &Item) -> Option<Prior> {
    let text = |name| string(item, name);
    let validators = Validators::parse(text("prior_etag"), text("prior_last_modified"));
    let prior = Prior::of((text("prior_result_key"), text("prior_sha256")), validators);
    if prior.is_none() && item.contains_key("prior_result_key") {
        tracing::warn!("the task's earlier result is not whole or not valid: fetched in full");
    }
    prior
}

fn status_of(item: &Item) -> Result<TaskStatus, StoreError> {
    let raw = string(item, "status");
    raw.and_then(TaskStatus::parse)
        .ok_or_else(|| StoreError::Corrupt {
            what: "task",
            detail: format!("status {raw:?} is not one of pending, processing, successful, failed"),
        })
}

/// The task item's writes.
pub(crate) mod writes;

/// The terminal write without a run's count, which the counted writes also fall back on.
pub(crate) mod terminal;

/// A job's and run's items, as the guard reads them (one strongly consistent
/// `BatchGetItem`).
pub(crate) async fn parents_of(
    store: &DynamoTaskStore,
    job_id: &Id,
    run_id: &Id,
) -> Result<Parents, StoreError> {
    let run_sort = keys::run_sort(run_id);
    let asked = KeysAndAttributes::builder()
        .keys(keys::job_key(job_id))
        .keys(keys::run_key(job_id, run_id))
        .projection_expression(
            "sk, #status, counter_shards, counter_groups, paid_tier_budget_bytes, \
             host_max_rps, host_max_inflight, obey_robots, politeness_key, \
             block_detection, block_signatures, render, render_wait_for, render_timeout_ms, \
             render_screenshot",
        )
        .expression_attribute_names("#status", "status")
        .consistent_read(true)
        .build()
        .expect("keys, the one required field, are set");
    let items = store.batch_get(asked, "BatchGetItem").await?;
    let mut parents = Parents::default();
    for item in items {
        let status = string(&item, "status").map(str::to_owned);
        match string(&item, "sk") {
            Some(keys::JOB_SORT) => {
                parents.job_status = status;
                parents.politeness = jobs::politeness(&item);
                parents.detection = jobs::detection(&item);
                parents.render = jobs::render(&item);
            }
            Some(sk) if sk == run_sort => {
                parents.run_status = status;
                parents.counting = Counting::of(
                    number(&item, "counter_shards"),
                    number(&item, "counter_groups"),
                );
                parents.paid_budget = number(&item, "paid_tier_budget_bytes");
            }
            _ => {}
        }
    }
    Ok(parents)
}
