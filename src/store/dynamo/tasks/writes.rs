//! The task item's writes: the claim and its release, the terminal write (or one
//! replacing a failure), the tries spent, and a failed task put back to `pending` by a re-queue.

use std::time::SystemTime;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::domain::bounds::Reason;
use crate::domain::model::{Lease, StoredResult, TaskStatus, Terminal, TriesFrom};
use crate::domain::time::{epoch_millis, rfc3339};
use crate::store::dynamo::attributes::{n, s};
use crate::store::dynamo::expressions::Expression;

/// Only a task in one of these states can be claimed or finished.
const OPEN: &str = "#status IN (:pending, :processing)";

/// Moves a pending or processing task to processing, and counts the attempt in its set of
/// tries. A fresh set starts at one. An item without `tries_since` takes the claim's. With a
/// lease, the write happens only if no other delivery holds a live lease, and takes it.
pub(crate) fn claim(now: SystemTime, lease: Option<Lease<'_>>, tries: TriesFrom) -> Expression {
    let count = match (tries.since, tries.fresh) {
        (Some(_), true) => "REMOVE tries_spent SET attempts = :one, tries_since = :since,",
        (Some(_), false) => "SET tries_since = if_not_exists(tries_since, :since),",
        (None, _) => "SET",
    };
    let add = if tries.fresh && tries.since.is_some() {
        ""
    } else {
        " ADD attempts :one"
    };
    let claim = format!("{count} #status = :processing, updated_at = :now");
    let expression = match lease {
        None => Expression::new(format!("{claim}{add}"), OPEN),
        Some(lease) => Expression::new(
            format!("{claim}, lease_owner = :owner, lease_until = :until{add}"),
            "#status IN (:pending, :processing) AND (attribute_not_exists(lease_until) \
         OR lease_until < :now_ms OR lease_owner = :owner)",
        )
        .value(":owner", s(lease.owner))
        .value(":until", n(epoch_millis(lease.until)))
        .value(":now_ms", n(epoch_millis(now))),
    }
    .name("#status", "status")
    .value(":pending", s(TaskStatus::Pending.as_str()))
    .value(":processing", s(TaskStatus::Processing.as_str()))
    .value(":now", s(&rfc3339(now)))
    .value(":one", n(1));
    match tries.since {
        Some(since) => expression.value(":since", n(since)),
        None => expression,
    }
}

/// Gives back a claim's attempt and the status it found, while the task is still
/// processing. With `owner`, it also gives up the lease the claim took, while `owner` holds
/// it.
pub(crate) fn unclaim(was: TaskStatus, owner: Option<&str>) -> Expression {
    const UNCLAIM: &str = "SET #status = :was ADD attempts :minus_one";
    const STILL_OURS: &str = "#status = :processing AND attempts > :zero";
    match owner {
        None => Expression::new(UNCLAIM.into(), STILL_OURS),
        Some(owner) => Expression::new(
            format!("{UNCLAIM} REMOVE lease_owner, lease_until"),
            "#status = :processing AND attempts > :zero AND lease_owner = :owner",
        )
        .value(":owner", s(owner)),
    }
    .name("#status", "status")
    .value(":was", s(was.as_str()))
    .value(":processing", s(TaskStatus::Processing.as_str()))
    .value(":minus_one", n(-1))
    .value(":zero", n(0))
}

/// Marks an open task's tries as spent, with the reason on our side that ended its final
/// attempt.
pub(crate) fn spend_tries(reason: &Reason) -> Expression {
    Expression::new(
        "SET tries_spent = :reason".into(),
        "#status IN (:pending, :processing)",
    )
    .name("#status", "status")
    .value(":reason", s(reason.as_str()))
    .value(":pending", s(TaskStatus::Pending.as_str()))
    .value(":processing", s(TaskStatus::Processing.as_str()))
}

/// The lease given up, if `owner` still holds it.
pub(crate) fn release(owner: &str) -> Expression {
    Expression::new(
        "REMOVE lease_owner, lease_until".into(),
        "lease_owner = :owner",
    )
    .value(":owner", s(owner))
}

/// Which task states a terminal write may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// Pending or processing: the one terminal write.
    Open,
    /// Failed without a stored result: a success that lost the race to a failure.
    FailureWithoutResult,
}

/// The task's terminal write, conditional on the task being in a state it may replace. It
/// removes the lease too. Empty optional values (a minimal record) are removed, not written.
pub(crate) fn task_terminal(terminal: &Terminal, now: &str, over: Over) -> Expression {
    let mut set = vec![
        "#status = :status",
        "updated_at = :now",
        "finished_at = :now",
    ];
    let mut remove = vec!["lease_owner", "lease_until"];
    let mut values = vec![(":status", s(terminal.status().as_str())), (":now", s(now))];
    match terminal {
        Terminal::Succeeded(_) => success_fields(terminal, &mut set, &mut remove, &mut values),
        Terminal::Failed(f) => {
            set.push("#error = :error");
            values.push((":error", s(&f.reason)));
            match f.http_status {
                Some(http) => {
                    set.push("http_status = :http");
                    values.push((":http", n(http)));
                }
                None => remove.push("http_status"),
            }
        }
    }
    let update = format!("SET {} REMOVE {}", set.join(", "), remove.join(", "));
    let expression = match over {
        Over::Open => Expression::new(update, OPEN)
            .value(":pending", s(TaskStatus::Pending.as_str()))
            .value(":processing", s(TaskStatus::Processing.as_str())),
        Over::FailureWithoutResult => Expression::new(
            update,
            "#status = :failed AND attribute_not_exists(result_key)",
        )
        .value(":failed", s(TaskStatus::Failed.as_str())),
    };
    let expression = values
        .into_iter()
        .fold(expression, |e, (placeholder, value)| {
            e.value(placeholder, value)
        });
    expression.name("#status", "status").name("#error", "error")
}

/// A success's text fields that may be empty. Each is set when the success has a value, and
/// removed when not, so an earlier result's values are not left behind.
const OPTIONAL_TEXTS: [(&str, &str, &str); 4] = [
    ("content_type = :ctype", "content_type", ":ctype"),
    ("final_url = :final", "final_url", ":final"),
    ("etag = :etag", "etag", ":etag"),
    ("last_modified = :modified", "last_modified", ":modified"),
];

/// What a success writes: the object's identity, and its content type and final URL when
/// they are not empty. A failure's error is removed.
fn success_fields(
    terminal: &Terminal,
    set: &mut Vec<&str>,
    remove: &mut Vec<&str>,
    values: &mut Vec<(&str, AttributeValue)>,
) {
    let Terminal::Succeeded(r) = terminal else {
        return;
    };
    set.extend(["result_key = :key", "result_sha256 = :sha"]);
    set.extend(["result_size = :size", "http_status = :http"]);
    values.extend([(":key", s(r.key.as_str())), (":sha", s(&r.sha256))]);
    values.extend([(":size", n(r.size)), (":http", n(r.http_status))]);
    if r.not_modified {
        set.push("not_modified = :not_modified");
        values.push((":not_modified", AttributeValue::Bool(true)));
    } else {
        remove.push("not_modified");
    }
    mark_fields(r, set, remove, values);
    let (etag, date) = (&r.validators.etag, &r.validators.last_modified);
    let texts = [
        &*r.content_type,
        &*r.final_url,
        etag.as_ref().map_or("", |e| e.as_str()),
        date.as_ref().map_or("", |d| d.as_str()),
    ];
    for ((assignment, name, placeholder), value) in OPTIONAL_TEXTS.into_iter().zip(texts) {
        if value.is_empty() {
            remove.push(name);
        } else {
            set.push(assignment);
            values.push((placeholder, s(value)));
        }
    }
    remove.push("#error");
}

/// The page's marks: `shell` and the rule it met, or neither; `rendered` when a browser
/// rendered it.
fn mark_fields(
    r: &StoredResult,
    set: &mut Vec<&str>,
    remove: &mut Vec<&str>,
    values: &mut Vec<(&str, AttributeValue)>,
) {
    match &r.shell {
        Some(rule) => {
            set.extend(["shell = :shell", "shell_rule = :shell_rule"]);
            values.push((":shell", AttributeValue::Bool(true)));
            values.push((":shell_rule", s(rule.as_str())));
        }
        None => remove.extend(["shell", "shell_rule"]),
    }
    match r.rendered {
        Some(_) => {
            set.push("rendered = :rendered");
            values.push((":rendered", AttributeValue::Bool(true)));
        }
        None => remove.push("rendered"),
    }
    match &r.render_reason {
        Some(reason) => {
            set.push("render_reason = :render_reason");
            values.push((":render_reason", s(reason.as_str())));
        }
        None => remove.push("render_reason"),
    }
}

/// The operator's re-queue of a failed task: back to pending with a fresh set of tries,
/// its failure and any dead lease cleared.
pub(crate) fn requeue_task(now: &str) -> Expression {
    Expression::new(
        "SET #status = :pending, updated_at = :now, requeued_at = :now, attempts = :zero \
     REMOVE #error, http_status, finished_at, lease_owner, lease_until, tries_since, \
     tries_spent"
            .into(),
        "#status = :failed",
    )
    .name("#status", "status")
    .name("#error", "error")
    .value(":pending", s(TaskStatus::Pending.as_str()))
    .value(":failed", s(TaskStatus::Failed.as_str()))
    .value(":now", s(now))
    .value(":zero", n(0))
}
