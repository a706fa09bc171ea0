//! The host item's writes: take the schedule and a slot for a fetch, give the slot back,
//! record a push-back, keep robots.txt, and the operator's reset.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::domain::health::Trouble;
use crate::domain::limits::{Ask, Booker, HostState, Slot, Tail};
use crate::store::dynamo::attributes::{n, s};
use crate::store::dynamo::expressions::Expression;

/// Takes a host's schedule for one fetch: `polite::limits::decide`, written as conditions.
/// No cooldown may be in force. The rate's next start is reserved. With `busy`, the
/// schedule runs ahead of now and stays within the fetch's horizon, so the start is the old
/// next start. Otherwise the fetch starts now. The in-flight slot must be free or expired.
/// With a `tail`, the start is the booker's: its stretch at the schedule's end goes on
/// (`true`, as the sandbox's view guessed, checked by a condition) or begins at the start.
pub(crate) fn host_take(ask: &Ask, busy: bool, tail: Option<(&Booker, bool)>) -> Expression {
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
    if let (Some(_), Some((booker, goes_on))) = (ask.interval, tail) {
        expression = expression.value(":run", s(&booker.to_string()));
        let (set, condition) = tail_write(busy, goes_on);
        sets.push(set);
        conditions.extend(condition);
    }
    if let Some(Slot { index: slot, until }) = ask.slot {
        sets.push("#slot = :until");
        conditions.push("(attribute_not_exists(#slot) OR #slot <= :now)");
        expression = expression
            .name("#slot", &format!("slot_{slot}"))
            .value(":until", n(until));
        expression = (0..ask.slots).fold(expression, |e, i| {
            e.name(&format!("#s{i}"), &format!("slot_{i}"))
        });
    }
    sets.push("touched_at = :now");
    expression.update = format!("SET {}", sets.join(", "));
    expression.condition = conditions.join(" AND ");
    if ask.slot.is_some() {
        let probe = one_probe(ask.slots);
        expression.condition = format!("{} AND {probe}", expression.condition);
    }
    expression.value(":now", n(ask.now))
}

/// Gives the schedule's tail back: the next start moves back to `to`, while the tail still
/// ends the schedule unbroken. The stretch from `to` is marked given back at `now`.
pub(crate) fn host_give_back(tail: &Tail, to: u64, now: u64) -> Expression {
    Expression::new(
        "SET next_start = :to, given_back_from = :to, given_back_at = :now \
         REMOVE tail_run, tail_from, tail_until"
            .into(),
        "tail_run = :run AND tail_from = :from AND tail_until = :until AND next_start = :until",
    )
    .value(":to", n(to))
    .value(":now", n(now))
    .value(":run", s(&tail.run.to_string()))
    .value(":from", n(tail.from))
    .value(":until", n(tail.until))
}

/// The tail's part of a take: what it sets, and the condition that the guess of whether the
/// booker's stretch goes on holds (`None`: a fresh schedule begins a stretch anyway).
fn tail_write(busy: bool, goes_on: bool) -> (&'static str, Option<&'static str>) {
    match (busy, goes_on) {
        (true, true) => (
            "tail_until = next_start + :interval",
            Some("tail_run = :run AND tail_until = next_start"),
        ),
        (true, false) => (
            "tail_run = :run, tail_from = next_start, tail_until = next_start + :interval",
            Some(
                "(attribute_not_exists(tail_run) OR tail_run <> :run OR tail_until <> next_start)",
            ),
        ),
        (false, _) => (
            "tail_run = :run, tail_from = :now, tail_until = :first_next",
            None,
        ),
    }
}

/// The condition that keeps a failing site to one fetch at a time: the site is not failing,
/// or none of its first `slots` slots is held.
fn one_probe(slots: u32) -> String {
    let free: Vec<String> = (0..slots)
        .map(|i| format!("(attribute_not_exists(#s{i}) OR #s{i} <= :now)"))
        .collect();
    let mut condition = "(attribute_not_exists(failing_until) OR failing_until <= :now".to_owned();
    // DynamoDB refuses redundant parentheses: one slot's term is already in its own.
    match free.as_slice() {
        [] => {}
        [one] => condition.push_str(&format!(" OR {one}")),
        all => condition.push_str(&format!(" OR ({})", all.join(" AND "))),
    }
    condition.push(')');
    condition
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
    // An answer closes a failing site's breaker.
    Expression::new(
        "REMOVE #slot, failing_until SET answer_ms = :mean, floor_ms = :floor".into(),
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
    if let Some(until) = trouble.failing_until {
        sets.push("failing_until = :failing");
        values.push((":failing", n(until)));
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

/// Clears a host's schedule, if it has an item: the next start and its tail, the slowdown
/// and its knee, the cooldown and its length, and every in-flight slot up to `slots`. The
/// answer times are kept. A start booked before `now` for a later time is void (the same
/// mark as a stretch given back), so a parked task asks the schedule again at its start
/// instead of going on top of the new schedule.
pub(crate) fn host_reset(now: u64, slots: u32) -> Expression {
    let slots = (0..slots)
        .map(|i| format!(", slot_{i}"))
        .collect::<String>();
    Expression::new(
        format!(
            "SET given_back_from = :now, given_back_at = :now \
             REMOVE next_start, tail_run, tail_from, tail_until, slowdown, slowdown_at, \
             slowdown_knee, cooldown_until, cooldown_ms, failing_until{slots}"
        ),
        "attribute_exists(pk)",
    )
    .value(":now", n(now))
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

/// Holds `hold` bytes of a host's robots.txt budget for one day: `used` (held and spent)
/// grows by the hold while it stays within the budget (`:most` is the budget less the hold).
pub(crate) fn robots_paid_earmark(hold: u64, budget: u64) -> Option<Expression> {
    let most = budget.checked_sub(hold)?;
    let expression = Expression::new(
        "ADD used :hold, fetches :one".into(),
        "attribute_not_exists(used) OR used <= :most",
    );
    Some(
        expression
            .value(":hold", n(hold))
            .value(":one", n(1))
            .value(":most", n(most)),
    )
}

/// Settles a hold: what was not spent leaves `used`, and the spend is added to `spent`.
pub(crate) fn robots_paid_settle(hold: u64, spent: u64) -> Expression {
    let unspent = i128::from(spent) - i128::from(hold);
    Expression::new("ADD used :unspent, spent :spent".into(), "")
        .value(":unspent", n(unspent))
        .value(":spent", n(spent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_sites_one_probe_condition_has_no_redundant_parentheses_at_any_slot_count() {
        for slots in [0, 1, 2, 8] {
            let condition = one_probe(slots);

            assert_eq!(
                condition.matches('(').count(),
                condition.matches(')').count()
            );
            // Two slots' terms are joined by AND inside one pair: needed, not redundant.
            assert_eq!(
                condition.contains("(("),
                slots >= 2,
                "{slots} slots: {condition}"
            );
        }
        assert_eq!(
            one_probe(1),
            "(attribute_not_exists(failing_until) OR failing_until <= :now \
             OR (attribute_not_exists(#s0) OR #s0 <= :now))"
        );
    }
}
