//! The run item's writes.

use crate::domain::model::Terminal;
use crate::store::dynamo::attributes::{n, s};
use crate::store::dynamo::expressions::Expression;

/// How the terminal write's transaction treats the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunStep {
    /// More than one task remains: count this one.
    Count,
    /// This is the last task of a running run: count it and complete the run.
    CountAndComplete,
    /// The run is not running: count it, complete nothing.
    CountOnly,
    /// A success replaces a failure already counted: move one count from failed to
    /// succeeded. The run's remaining count and status stay as they are.
    Recount,
}

/// The run's side of the terminal write.
pub(crate) fn run_count(step: RunStep, terminal: &Terminal, now: &str) -> Expression {
    let counter = match terminal {
        Terminal::Succeeded(_) => "tasks_succeeded",
        Terminal::Failed(_) => "tasks_failed",
    };
    let add = format!("ADD tasks_remaining :minus_one, {counter} :one");
    let count = format!("{add} SET updated_at = :now");
    let expression = match step {
        RunStep::Count => Expression::new(count, "tasks_remaining > :one"),
        RunStep::CountAndComplete => Expression::new(
            // `times_completed` lets anyone check that the run completed exactly once.
            format!(
                "{add}, times_completed :one \
             SET updated_at = :now, #status = :completed, completed_at = :now"
            ),
            "tasks_remaining = :one AND #status = :running",
        )
        .name("#status", "status")
        .value(":completed", s("completed"))
        .value(":running", s("running")),
        // Never on a running run: its last task must complete it.
        RunStep::CountOnly => Expression::new(
            count,
            "attribute_exists(tasks_remaining) AND #status <> :running",
        )
        .name("#status", "status")
        .value(":running", s("running")),
        RunStep::Recount => Expression::new(
            "ADD tasks_failed :minus_one, tasks_succeeded :one SET updated_at = :now".into(),
            "attribute_exists(tasks_remaining)",
        ),
    };
    expression
        .value(":minus_one", n(-1))
        .value(":one", n(1))
        .value(":now", s(now))
}

/// The run's side of a re-queue: the task is counted back into the remaining ones, which
/// reopens a completed run. Never for a cancelled run.
pub(crate) fn requeue_run(now: &str) -> Expression {
    Expression::new(
        "ADD tasks_failed :minus_one, tasks_remaining :one \
     SET #status = :running, updated_at = :now REMOVE completed_at"
            .into(),
        "attribute_exists(tasks_remaining) AND #status <> :cancelled",
    )
    .name("#status", "status")
    .value(":minus_one", n(-1))
    .value(":one", n(1))
    .value(":running", s("running"))
    .value(":cancelled", s("cancelled"))
    .value(":now", s(now))
}
