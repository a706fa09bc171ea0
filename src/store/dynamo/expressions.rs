//! Every DynamoDB write expression, in one place: the claim and its lease, the lease's
//! release, the task's terminal write and its run's count, the operator's re-queue, and a
//! host's shared schedule, slots and robots.txt fetch.
//! Each states exactly the names and values it uses (DynamoDB refuses unused ones).

use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, Update};

use crate::domain::model::Lease;
use crate::domain::model::{TaskStatus, Terminal};
use crate::domain::spend::Spend;
use crate::domain::time::{epoch_millis, rfc3339};
use crate::store::dynamo::attributes::{Item, n, s};

/// An update with its condition, names and values.
pub(crate) struct Expression {
    update: String,
    condition: String,
    names: HashMap<String, String>,
    values: Item,
}

impl Expression {
    pub(crate) fn new(update: String, condition: &str) -> Self {
        Self {
            update,
            condition: condition.to_owned(),
            names: HashMap::new(),
            values: Item::new(),
        }
    }

    pub(crate) fn name(mut self, placeholder: &str, name: &str) -> Self {
        self.names.insert(placeholder.into(), name.into());
        self
    }

    pub(crate) fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.into(), value);
        self
    }

    /// With one delivery's spend added to the item (a counter item: the run or a shard),
    /// in the same `ADD` clause as its counts.
    pub(crate) fn with_spend(mut self, spend: &Spend) -> Self {
        let mut adds = Vec::new();
        for (tier, spent) in spend.spent() {
            let (requests, bytes) = spend_names(tier);
            adds.push(format!("{requests} :spent_r{tier}, {bytes} :spent_b{tier}"));
            self = self
                .value(&format!(":spent_r{tier}"), n(spent.requests))
                .value(&format!(":spent_b{tier}"), n(spent.bytes));
        }
        if adds.is_empty() {
            return self;
        }
        let adds = adds.join(", ");
        self.update = match self.update.split_once("ADD ") {
            Some((before, after)) => format!("{before}ADD {adds}, {after}"),
            None => format!("{} ADD {adds}", self.update)
                .trim_start()
                .to_owned(),
        };
        self
    }

    /// As one item of a transaction.
    pub(crate) fn into_update(self, table: &str, key: Item) -> Update {
        Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(self.update)
            .condition_expression(self.condition)
            .set_expression_attribute_names(non_empty(self.names))
            .set_expression_attribute_values(non_empty(self.values))
            // What the item was when the condition failed: a success tells a failure it
            // may replace from one it may not.
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("table, key and update expression, the required fields, are set")
    }

    /// As an `UpdateItem` request.
    pub(crate) fn apply_to(self, request: UpdateItemFluentBuilder) -> UpdateItemFluentBuilder {
        let condition = (!self.condition.is_empty()).then_some(self.condition);
        request
            .update_expression(self.update)
            .set_condition_expression(condition)
            .set_expression_attribute_names(non_empty(self.names))
            .set_expression_attribute_values(non_empty(self.values))
    }
}

/// DynamoDB refuses an empty map of expression names or values.
fn non_empty<V>(map: HashMap<String, V>) -> Option<HashMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

/// Only a task in one of these states can be claimed or finished.
const OPEN: &str = "#status IN (:pending, :processing)";

/// A pending or processing task to processing, counting the attempt; with a lease, only if
/// no other delivery holds a live one, and taking it.
pub(crate) fn claim(now: SystemTime, lease: Option<Lease<'_>>) -> Expression {
    const CLAIM: &str = "SET #status = :processing, updated_at = :now";
    match lease {
        None => Expression::new(format!("{CLAIM} ADD attempts :one"), OPEN),
        Some(lease) => Expression::new(
            format!("{CLAIM}, lease_owner = :owner, lease_until = :until ADD attempts :one"),
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
    .value(":one", n(1))
}

/// A claim's attempt given back, and the status it found, while the task is still
/// processing.
pub(crate) fn unclaim(was: TaskStatus) -> Expression {
    Expression::new(
        "SET #status = :was ADD attempts :minus_one".into(),
        "#status = :processing AND attempts > :zero",
    )
    .name("#status", "status")
    .value(":was", s(was.as_str()))
    .value(":processing", s(TaskStatus::Processing.as_str()))
    .value(":minus_one", n(-1))
    .value(":zero", n(0))
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

/// The task's terminal write, conditional on the task being in a state it may replace; the
/// lease goes with it. Empty optional values (a minimal record) are removed, not written.
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

/// What a success writes: the object's identity, and its content type and final URL when
/// they are not empty; a failure's error goes.
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
    let optional = [
        (
            "content_type = :ctype",
            "content_type",
            ":ctype",
            &*r.content_type,
        ),
        ("final_url = :final", "final_url", ":final", &*r.final_url),
    ];
    for (assignment, name, placeholder, value) in optional {
        if value.is_empty() {
            remove.push(name);
        } else {
            set.push(assignment);
            values.push((placeholder, s(value)));
        }
    }
    remove.push("#error");
}

/// How the terminal write's transaction treats the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunStep {
    /// More than one task remains: count this one.
    Count,
    /// This is the last task of a running run: count it and complete the run.
    CountAndComplete,
    /// The run is not running (or its counters are off): count it, complete nothing.
    CountOnly,
    /// A success replaces a failure already counted: move one count from failed to
    /// succeeded; the run's remaining count and status stay.
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
        RunStep::CountOnly => Expression::new(count, "attribute_exists(tasks_remaining)"),
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

/// The operator's re-queue of a failed task: back to pending, its failure and any dead
/// lease cleared.
pub(crate) fn requeue_task(now: &str) -> Expression {
    Expression::new(
        "SET #status = :pending, updated_at = :now, requeued_at = :now \
         REMOVE #error, http_status, finished_at, lease_owner, lease_until"
            .into(),
        "#status = :failed",
    )
    .name("#status", "status")
    .name("#error", "error")
    .value(":pending", s(TaskStatus::Pending.as_str()))
    .value(":failed", s(TaskStatus::Failed.as_str()))
    .value(":now", s(now))
}

/// The run's side of a re-queue: the task counted back into the remaining ones, which
/// reopens a completed run; never a cancelled one.
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

/// A put that only creates: nothing with this key yet.
pub(crate) const ABSENT: &str = "attribute_not_exists(pk)";

/// The producer's submit cursor moved on: tasks before `through` are written and sent.
pub(crate) fn advance_submitted(through: u64, now: &str) -> Expression {
    Expression::new(
        "SET submitted_through = :through, updated_at = :now".into(),
        "attribute_not_exists(submitted_through) OR submitted_through < :through",
    )
    .value(":through", n(through))
    .value(":now", s(now))
}

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

/// A counter shard's side of a success replacing a failure it counted (as a run's own).
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

/// The run's side when its child (a shard, or a group) counts its last: one fewer left in
/// `left` (`shards_remaining` or `groups_remaining`), the last completing a running run
/// (`step` as for a run's own count).
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

/// A counter shard's side of a re-queue: the task counted back into its remaining ones;
/// `reopens` when the shard had none left (then its parent counts it open again too).
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
/// left; `reopens` when it had none left (then the run counts it open again too).
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

/// The run's side of a re-queue that reopens one of its children (`left`: the count of
/// them), and so the run.
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

/// A host's schedule taken for one fetch (`polite::limits::decide`, as conditions): no
/// cooldown in force; the rate's next start reserved (`busy`: the schedule runs ahead of now
/// and stays within the fetch's horizon, so the start is the old next start; else it starts
/// now); the in-flight slot free or lapsed.
pub(crate) fn host_take(ask: &crate::domain::limits::Ask, busy: bool) -> Expression {
    let mut sets = Vec::new();
    let mut conditions = vec!["(attribute_not_exists(cooldown_until) OR cooldown_until <= :now)"];
    let mut expression = Expression::new(String::new(), "");
    if let Some(interval) = ask.interval {
        expression = if busy {
            sets.push("next_start = next_start + :interval");
            conditions.push("next_start >= :now AND next_start <= :horizon");
            expression
                .value(":horizon", n(ask.horizon))
                .value(":interval", n(interval))
        } else {
            sets.push("next_start = :first_next");
            conditions.push("(attribute_not_exists(next_start) OR next_start < :now)");
            expression.value(":first_next", n(ask.now + interval))
        };
    }
    if let Some((slot, until)) = ask.slot {
        sets.push("#slot = :until");
        conditions.push("(attribute_not_exists(#slot) OR #slot <= :now)");
        expression = expression
            .name("#slot", &format!("slot_{slot}"))
            .value(":until", n(until));
    }
    sets.push("touched_at = :now");
    expression.update = format!("SET {}", sets.join(", "));
    expression.condition = conditions.join(" AND ");
    expression.value(":now", n(ask.now))
}

/// A fetch's end at a host: its slot given back, if still its own.
pub(crate) fn host_leave((slot, until): (usize, u64)) -> Expression {
    Expression::new("REMOVE #slot".into(), "#slot = :mine")
        .name("#slot", &format!("slot_{slot}"))
        .value(":mine", n(until))
}

/// The host pushed back: the cooldown and slowdown every sandbox then obeys, only if the
/// cooldown ends later than the one in force (a push-back only lengthens it).
pub(crate) fn host_push_back((until, slowdown): (u64, f64), now: u64) -> Expression {
    Expression::new(
        "SET cooldown_until = :cooldown, slowdown = :slowdown, slowdown_at = :now".into(),
        "attribute_not_exists(cooldown_until) OR cooldown_until < :cooldown",
    )
    .value(":cooldown", n(until))
    .value(":slowdown", n(slowdown))
    .value(":now", n(now))
}

/// The one fleet-wide fetch of a host's robots.txt: taken while none is fresh and nobody
/// else is fetching it.
pub(crate) fn robots_take(now: u64, until: u64) -> Expression {
    Expression::new(
        "SET lease_until = :until".into(),
        "(attribute_not_exists(expires_at) OR expires_at <= :now) \
         AND (attribute_not_exists(lease_until) OR lease_until <= :now)",
    )
    .value(":now", n(now))
    .value(":until", n(until))
}

/// The names of tier `tier`'s spend on a counter item: requests and body bytes received.
pub fn spend_names(tier: usize) -> (String, String) {
    (
        format!("proxy_requests_t{tier}"),
        format!("proxy_bytes_t{tier}"),
    )
}

/// One delivery's spend added to an existing counter item (run or shard), alone.
pub(crate) fn spend(spend: &Spend) -> Expression {
    Expression::new(String::new(), "attribute_exists(pk)").with_spend(spend)
}

/// A chunk of the run's paid-tier budget reserved, while what is reserved is below it.
pub(crate) fn reserve_paid(chunk: u64) -> Expression {
    Expression::new(
        "SET paid_tier_reserved_bytes = if_not_exists(paid_tier_reserved_bytes, :zero) + :chunk"
            .into(),
        "attribute_exists(paid_tier_budget_bytes) AND \
         (attribute_not_exists(paid_tier_reserved_bytes) \
         OR paid_tier_reserved_bytes < paid_tier_budget_bytes)",
    )
    .value(":zero", n(0))
    .value(":chunk", n(chunk))
}
