//! Counting a task in its run's counter tree (data contract v2). As with a run's own
//! counters, the terminal write and the count of the task's shard go in one transaction. The
//! shard's last task also counts the shard as done in its group (or in the run). A group's
//! last shard counts the group as done in the run. The run's last child completes the run.
//! A re-queue reopens the same path, from the bottom up. So the run item is written once per
//! group (or shard), not once per task. docs/design.md argues that this completes a run
//! exactly once. Re-queues are in `requeue.rs`.

pub(crate) mod requeue;
mod writes;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{TransactWriteItem, Update};

use crate::domain::ids::TaskRef;
use crate::domain::model::{Sharding, TaskStatus, Terminal};
use crate::domain::spend::DeliverySpend;
use crate::ports::error::StoreError;
use crate::ports::tasks::Finish;
use crate::store::dynamo::attributes::{Item, number, string};
use crate::store::dynamo::expressions::Expression;
use crate::store::dynamo::keys;
use crate::store::dynamo::run_counters::writes::RunStep;
use crate::store::dynamo::tasks::terminal::{finish_uncounted, is_failure_without_result};
use crate::store::dynamo::tasks::writes::{Over, task_terminal};
use crate::store::dynamo::{DynamoTaskStore, cancellation_codes};
use crate::store::error::cancellation_fault;

/// A counter on a task's path: its shard, the shard's group, the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Shard(u32),
    Group(u32),
    Run,
}

/// A task's counters, leaf first.
struct Path<'a> {
    task: &'a TaskRef,
    nodes: Vec<Node>,
    sharding: Sharding,
}

impl<'a> Path<'a> {
    fn of(task: &'a TaskRef, sharding: Sharding) -> Self {
        let shard = sharding.shard_of(&task.task_id);
        let group = sharding.group_of(shard).map(Node::Group);
        let nodes = [Some(Node::Shard(shard)), group, Some(Node::Run)];
        Self {
            task,
            nodes: nodes.into_iter().flatten().collect(),
            sharding,
        }
    }

    fn key(&self, level: usize) -> Item {
        let (job, run) = (&self.task.job_id, &self.task.run_id);
        match self.nodes[level] {
            Node::Shard(shard) => keys::shard_key(job, run, shard),
            Node::Group(group) => keys::group_key(job, run, group),
            Node::Run => keys::run_key(job, run),
        }
    }

    /// The attribute in which the node keeps what is left to count.
    fn left(&self, level: usize) -> &'static str {
        match self.nodes[level] {
            Node::Shard(_) => "tasks_remaining",
            Node::Group(_) => "shards_remaining",
            Node::Run if self.sharding.groups > 0 => "groups_remaining",
            Node::Run => "shards_remaining",
        }
    }

    /// Counts the task up to `level`, where one or more is left.
    fn climb_to(&self, level: usize) -> Step {
        let how = match self.nodes[level] {
            Node::Run => Top::Run(RunStep::Count),
            _ => Top::Count,
        };
        Step::Climb { top: level, how }
    }
}

/// What a terminal write counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Count the task into its shard, and up the path to level `top`. Each node below `top`
    /// counts its last: its count goes from 1 to 0, so its parent counts it as done. `top`
    /// counts as `how` says.
    Climb { top: usize, how: Top },
    /// A success replacing a failure its shard counted.
    Recount,
}

/// How the highest node a terminal write reaches counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Top {
    /// More than one left there: one fewer.
    Count,
    /// Its last, but its parent is gone or done already (a producer's mistake). Counted
    /// alone.
    Orphan,
    /// The run: one child fewer. The last child completes it, unless it is not running.
    Run(RunStep),
}

/// The first try: count the task in its shard.
const COUNT: Step = Step::Climb {
    top: 0,
    how: Top::Count,
};

/// How a counted terminal write's transaction ended.
enum Counted {
    Written,
    /// The task is terminal already. `failed_without_result` says whether it failed without
    /// a result.
    TaskRefused {
        failed_without_result: bool,
    },
    /// A counter was not as the step expected. Holds the next step, from what the counter is
    /// now. `None` when the shard is gone or had nothing left to count.
    Refused(Option<Step>),
}

/// The update of the counter at `level` when the write climbs to `top`.
fn counter_update(
    path: &Path<'_>,
    level: usize,
    terminal: &Terminal,
    now: &str,
    (top, how): (usize, Top),
) -> Expression {
    let last = level < top || how == Top::Orphan;
    match (path.nodes[level], how) {
        (Node::Shard(_), _) => writes::shard_count(terminal, now, last),
        (Node::Group(_), _) => writes::group_count(now, last),
        (Node::Run, Top::Run(step)) => writes::children_done(step, path.left(level), now),
        (Node::Run, _) => writes::children_done(RunStep::Count, path.left(level), now),
    }
}

fn written(step: Step) -> Finish {
    let completed_run = matches!(
        step,
        Step::Climb {
            how: Top::Run(RunStep::CountAndComplete),
            ..
        }
    );
    if completed_run {
        tracing::info!("the run is complete");
    }
    Finish::Written {
        completed_run,
        spend_counted: true,
    }
}

/// A cancelled counted terminal write: which item's condition failed, and the step that the
/// counter, as it is now, calls for.
fn finish_refusal(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
    path: &Path<'_>,
    step: Step,
) -> Result<Counted, StoreError> {
    match condition_refused(err, "TransactWriteItems(finish)")? {
        (0, old) => Ok(Counted::TaskRefused {
            failed_without_result: old.as_ref().is_some_and(is_failure_without_result),
        }),
        (at, old) => Ok(Counted::Refused(next_step(
            path,
            at - 1,
            old.as_ref(),
            step,
        ))),
    }
}

/// The step after the counter at `level` refused, from what it is now.
fn next_step(path: &Path<'_>, level: usize, old: Option<&Item>, step: Step) -> Option<Step> {
    if step == Step::Recount {
        return None;
    }
    let old = old.filter(|item| !item.is_empty());
    let orphan_below = |level: usize| {
        let top = level.checked_sub(1)?;
        Some(Step::Climb {
            top,
            how: Top::Orphan,
        })
    };
    if path.nodes[level] == Node::Run {
        let how = run_step(old, path.left(level));
        return how.map_or_else(
            || orphan_below(level),
            |how| Some(Step::Climb { top: level, how }),
        );
    }
    match old.and_then(|item| number::<i64>(item, path.left(level))) {
        Some(left) if left > 1 => Some(path.climb_to(level)),
        Some(1) => Some(path.climb_to(level + 1)),
        _ => orphan_below(level),
    }
}

/// The run's count that the run, as it is now, calls for. `None` when the run is gone or
/// keeps no such count.
fn run_step(run: Option<&Item>, left: &str) -> Option<Top> {
    let run = run?;
    let step = match (number::<i64>(run, left)?, string(run, "status")) {
        (left, _) if left > 1 => RunStep::Count,
        (1, Some("running")) => RunStep::CountAndComplete,
        _ => RunStep::CountOnly,
    };
    Some(Top::Run(step))
}

/// A cancelled transaction whose cause is a failed condition: the index of the item whose
/// condition failed, and that item as it was. Anything else (a conflict, throttling, an
/// invalid item) is an error.
fn condition_refused(
    err: SdkError<TransactWriteItemsError, HttpResponse>,
    operation: &'static str,
) -> Result<(usize, Option<Item>), StoreError> {
    let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
        err.as_service_error()
    else {
        return Err(StoreError::from_sdk(operation, err));
    };
    let reasons = cancelled.cancellation_reasons();
    let codes = cancellation_codes(reasons);
    if let Some(fault) = cancellation_fault(&codes) {
        return Err(StoreError::failed(operation, fault, err));
    }
    match codes
        .iter()
        .position(|code| *code == "ConditionalCheckFailed")
    {
        Some(at) => Ok((at, reasons[at].item().cloned())),
        None => Err(StoreError::from_sdk(operation, err)),
    }
}

/// The terminal write, counted in the run's counter tree.
pub(crate) async fn finish_sharded(
    store: &DynamoTaskStore,
    task: &TaskRef,
    (terminal, spend): (&Terminal, DeliverySpend<'_>),
    now: &str,
    sharding: Sharding,
) -> Result<Finish, StoreError> {
    let path = Path::of(task, sharding);
    let mut step = COUNT;
    // Each refusal returns the refusing counter as it is now. So two tries per level are
    // enough, unless counters keep changing underneath. That is a conflict to try again.
    for _ in 0..2 * path.nodes.len() + 2 {
        let counted = count_on_path(store, (terminal, spend), now, &path, step);
        let next = match counted.await? {
            Counted::Written => return Ok(written(step)),
            Counted::TaskRefused {
                failed_without_result: true,
            } if terminal.status() == TaskStatus::Successful => Step::Recount,
            Counted::TaskRefused { .. } => return Ok(Finish::LostRace),
            Counted::Refused(Some(next)) => next,
            Counted::Refused(None) => return uncounted(store, task, terminal, now, step).await,
        };
        step = next;
    }
    Err(StoreError::Changed {
        detail: "the task's counters kept changing under the terminal write".into(),
    })
}

/// One transaction: the task's terminal write, and its counters as `step` says.
async fn count_on_path(
    store: &DynamoTaskStore,
    (terminal, spend): (&Terminal, DeliverySpend<'_>),
    now: &str,
    path: &Path<'_>,
    step: Step,
) -> Result<Counted, StoreError> {
    let over = match step {
        Step::Recount => Over::FailureWithoutResult,
        Step::Climb { .. } => Over::Open,
    };
    let task = task_terminal(terminal, now, over).with_spend_by(spend);
    let mut updates = vec![task.into_update(&store.table, keys::task_key(path.task))];
    let counters: Vec<Expression> = match step {
        Step::Recount => vec![writes::shard_recount(terminal, now)],
        Step::Climb { top, how } => (0..=top)
            .map(|level| counter_update(path, level, terminal, now, (top, how)))
            .collect(),
    };
    for (level, counter) in counters.into_iter().enumerate() {
        // The shard (level 0) takes the delivery's spend, in the task's own transaction.
        let counter = if level == 0 {
            counter.with_spend(spend.spend).with_not_modified(terminal)
        } else {
            counter
        };
        updates.push(counter.into_update(&store.table, path.key(level)));
    }
    match transact(store, updates).await {
        Ok(()) => Ok(Counted::Written),
        Err(err) => finish_refusal(err, path, step),
    }
}

/// The terminal write without a count, for a task whose shard is gone or has counted all
/// its tasks already. That is a producer's mistake in sizing the shard. The task still
/// ends.
async fn uncounted(
    store: &DynamoTaskStore,
    task: &TaskRef,
    terminal: &Terminal,
    now: &str,
    step: Step,
) -> Result<Finish, StoreError> {
    tracing::warn!(
        ?step,
        "the task's counter shard is gone or has nothing left to count"
    );
    let over = match step {
        Step::Recount => Over::FailureWithoutResult,
        Step::Climb { .. } => Over::Open,
    };
    finish_uncounted(store, task, terminal, now, over).await
}

async fn transact(
    store: &DynamoTaskStore,
    updates: Vec<Update>,
) -> Result<(), SdkError<TransactWriteItemsError, HttpResponse>> {
    let items = updates
        .into_iter()
        .map(|u| TransactWriteItem::builder().update(u).build());
    store
        .client
        .transact_write_items()
        .set_transact_items(Some(items.collect()))
        .send()
        .await
        .map(|_| ())
}
