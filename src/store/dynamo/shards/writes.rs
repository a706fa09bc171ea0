//! The writes of a run's counter tree: a shard, a group and the run counting a task, or
//! counting it back on a re-queue.

use crate::domain::model::Terminal;
use crate::store::dynamo::attributes::{n, s};
use crate::store::dynamo::expressions::Expression;
use crate::store::dynamo::run_counters::writes::{RunStep, run_count};

/// A counter shard's side of a task's terminal write (data contract v2): count the task,
/// conditional on the shard having more than one task left (`last: false`) or exactly one.
pub(crate) fn shard_count(terminal: &Terminal, now: &str, last: bool) -> Expression {
    let counter = match terminal {
        Terminal::Succeeded(_) => "tasks_succeeded",
        Terminal::Failed(_) => "tasks_failed",
    };
    Expression::new(
        format!("ADD tasks_remaining :minus_one, {counter} :one SET updated_at = :now"),
        if last {
            "tasks_remaining = :one"
        } else {
            "tasks_remaining > :one"
        },
    )
    .value(":minus_one", n(-1))
    .value(":one", n(1))
    .value(":now", s(now))
}

/// A counter shard's side of a success replacing a failure it counted, as for a run's own
/// counters.
pub(crate) fn shard_recount(terminal: &Terminal, now: &str) -> Expression {
    run_count(RunStep::Recount, terminal, now)
}

/// A counter group's side when one of its shards counts its last task: one shard fewer
/// left, conditional on more than one left (`last: false`) or exactly one.
pub(crate) fn group_count(now: &str, last: bool) -> Expression {
    Expression::new(
        "ADD shards_remaining :minus_one SET updated_at = :now".into(),
        if last {
            "shards_remaining = :one"
        } else {
            "shards_remaining > :one"
        },
    )
    .value(":minus_one", n(-1))
    .value(":one", n(1))
    .value(":now", s(now))
}

/// The run's side when its child (a shard or a group) counts its last. One fewer is left in
/// `left` (`shards_remaining` or `groups_remaining`). The last child completes a running
/// run. `step` works as for a run's own count.
pub(crate) fn children_done(step: RunStep, left: &str, now: &str) -> Expression {
    let expression = match step {
        RunStep::Count => Expression::new(
            "ADD #left :minus_one SET updated_at = :now".into(),
            "#left > :one",
        )
        .value(":one", n(1)),
        RunStep::CountAndComplete => Expression::new(
            "ADD #left :minus_one, times_completed :one \
         SET updated_at = :now, #status = :completed, completed_at = :now"
                .into(),
            "#left = :one AND #status = :running",
        )
        .name("#status", "status")
        .value(":one", n(1))
        .value(":completed", s("completed"))
        .value(":running", s("running")),
        RunStep::CountOnly | RunStep::Recount => Expression::new(
            "ADD #left :minus_one SET updated_at = :now".into(),
            "attribute_exists(#left)",
        ),
    };
    expression
        .name("#left", left)
        .value(":minus_one", n(-1))
        .value(":now", s(now))
}

/// A counter shard's side of a re-queue: the task is counted back into its remaining ones.
/// `reopens` is set when the shard had none left. Then its parent counts it open again too.
pub(crate) fn shard_requeue(now: &str, reopens: bool) -> Expression {
    Expression::new(
        "ADD tasks_failed :minus_one, tasks_remaining :one SET updated_at = :now".into(),
        if reopens {
            "tasks_remaining = :zero"
        } else {
            "tasks_remaining > :zero"
        },
    )
    .value(":minus_one", n(-1))
    .value(":one", n(1))
    .value(":zero", n(0))
    .value(":now", s(now))
}

/// A counter group's side of a re-queue that reopens one of its shards: one more shard
/// left. `reopens` is set when the group had none left. Then the run counts it open again
/// too.
pub(crate) fn group_requeue(now: &str, reopens: bool) -> Expression {
    Expression::new(
        "ADD shards_remaining :one SET updated_at = :now".into(),
        if reopens {
            "shards_remaining = :zero"
        } else {
            "shards_remaining > :zero"
        },
    )
    .value(":one", n(1))
    .value(":zero", n(0))
    .value(":now", s(now))
}

/// The run's side of a re-queue that reopens one of its children, and so the run. `left`
/// names the count of those children.
pub(crate) fn children_reopened(left: &str, now: &str) -> Expression {
    Expression::new(
        "ADD #left :one SET #status = :running, updated_at = :now REMOVE completed_at".into(),
        "attribute_exists(#left) AND #status <> :cancelled",
    )
    .name("#left", left)
    .name("#status", "status")
    .value(":one", n(1))
    .value(":running", s("running"))
    .value(":cancelled", s("cancelled"))
    .value(":now", s(now))
}
