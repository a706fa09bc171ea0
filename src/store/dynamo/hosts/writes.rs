//! The host item's writes: take the schedule and a slot for a fetch, give the slot back,
//! record a push-back, and keep robots.txt.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::domain::health::Trouble;
use crate::domain::limits::{Ask, HostState, Slot};
use crate::store::dynamo::attributes::n;
use crate::store::dynamo::expressions::Expression;

/// Takes a host's schedule for one fetch: `polite::limits::decide`, written as conditions.
/// No cooldown may be in force. The rate's next start is reserved. With `busy`, the
/// schedule runs ahead of now and stays within the fetch's horizon, so the start is the old
/// next start. Otherwise the fetch starts now. The in-flight slot must be free or expired.
pub(crate) fn host_take(ask: &Ask, busy: bool) -> Expression {
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
    if let Some(Slot { index: slot, until }) = ask.slot {
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

/// A fetch's end at a host. Its slot is given back, if the fetch still holds it. If the
/// fetch got an answer, the host's answer times are written too, to a tenth of a millisecond.
pub(crate) fn host_leave(slot: Slot, answers: Option<(f64, f64)>) -> Expression {
    let Slot { index: slot, until } = slot;
    let Some((mean, floor)) = answers else {
        return Expression::new("REMOVE #slot".into(), "#slot = :mine")
            .name("#slot", &format!("slot_{slot}"))
            .value(":mine", n(until));
    };
    Expression::new(
        "REMOVE #slot SET answer_ms = :mean, floor_ms = :floor".into(),
        "#slot = :mine",
    )
    .name("#slot", &format!("slot_{slot}"))
    .value(":mine", n(until))
    .value(":mean", n(format!("{mean:.1}")))
    .value(":floor", n(format!("{floor:.1}")))
}

/// Records the host's trouble. The cooldown is written only if it ends later than the one in
/// force, so a push-back only lengthens it. The pace's drop, with the schedule restarted, is
/// written only if the slowdown is still the one in `read`, which it was computed from. So
/// a drop recorded meanwhile is not overwritten. The starts given before the drop are void,
/// however they were given.
pub(crate) fn host_push_back(read: &HostState, trouble: Trouble, now: u64) -> Expression {
    let mut sets = Vec::new();
    let mut conditions = Vec::new();
    let mut values: Vec<(&str, AttributeValue)> = Vec::new();
    if let Some(until) = trouble.cooldown_until {
        sets.push("cooldown_until = :cooldown");
        conditions.push("(attribute_not_exists(cooldown_until) OR cooldown_until < :cooldown)");
        values.push((":cooldown", n(until)));
    }
    if let Some(length) = trouble.cooldown_ms {
        sets.push("cooldown_ms = :length");
        values.push((":length", n(length)));
    }
    if let Some(slowdown) = trouble.slowdown {
        sets.extend(["slowdown = :slowdown", "slowdown_at = :now"]);
        values.extend([(":slowdown", n(slowdown)), (":now", n(now))]);
        conditions.push(match read.slowdown {
            None => "attribute_not_exists(slowdown)",
            Some((slowdown, at)) => {
                values.extend([(":read", n(slowdown)), (":read_at", n(at))]);
                "slowdown = :read AND slowdown_at = :read_at"
            }
        });
    }
    if let Some(next) = trouble.next_start {
        sets.push("next_start = :next");
        values.push((":next", n(next)));
    }
    let mut update = format!("SET {}", sets.join(", "));
    match (trouble.slowdown, trouble.knee) {
        (Some(_), Some(knee)) => {
            update.push_str(", slowdown_knee = :knee");
            values.push((":knee", n(knee)));
        }
        (Some(_), None) => update.push_str(" REMOVE slowdown_knee"),
        (None, _) => {}
    }
    let condition = if conditions.is_empty() {
        "attribute_exists(pk)".to_owned()
    } else {
        conditions.join(" AND ")
    };
    values
        .into_iter()
        .fold(Expression::new(update, &condition), |e, (name, value)| {
            e.value(name, value)
        })
}

/// Marks a robots item that cannot be read as expired, if its expiry is still `seen`.
pub(crate) fn robots_expire(seen: AttributeValue) -> Expression {
    Expression::new("REMOVE expires_at".into(), "expires_at = :seen").value(":seen", seen)
}

/// Claims the single fleet-wide fetch of a host's robots.txt, while no fresh copy is kept and
/// nobody else is fetching it.
pub(crate) fn robots_take(now: u64, until: u64) -> Expression {
    Expression::new(
        "SET lease_until = :until".into(),
        "(attribute_not_exists(expires_at) OR expires_at <= :now) \
     AND (attribute_not_exists(lease_until) OR lease_until <= :now)",
    )
    .value(":now", n(now))
    .value(":until", n(until))
}
