//! Message parsing: an SQS body becomes the task it names, or poison with the reason why not.

use serde_json::{Map, Value};

use crate::domain::ids::{Id, MAX_SPREAD, TaskRef};

/// A body that can never name a task; redelivering it would only burn receives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Poison(pub String);

/// The body a producer sends for `task`: what [`parse_body`] reads.
pub fn body(task: &TaskRef) -> String {
    let mut body = serde_json::json!({
        "job_id": task.job_id.as_str(),
        "run_id": task.run_id.as_str(),
        "task_id": task.task_id.as_str(),
    });
    if let Some(shards) = task.spread {
        body[SPREAD] = shards.into();
    }
    body.to_string()
}

/// Data contract v3: the run's `counter_shards`, over which its tasks and results spread.
const SPREAD: &str = "task_shards";

/// Reads `{"job_id": "...", "run_id": "...", "task_id": "..."}` and, in data contract v3,
/// `"task_shards": N`; unknown fields are ignored.
pub fn parse_body(body: Option<&str>) -> Result<TaskRef, Poison> {
    let body = body.ok_or_else(|| Poison("the message has no body".into()))?;
    let value: Value =
        serde_json::from_str(body).map_err(|e| Poison(format!("the body is not JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(Poison("the body is not a JSON object".into()));
    };
    Ok(TaskRef {
        job_id: id_field(&fields, "job_id")?,
        run_id: id_field(&fields, "run_id")?,
        task_id: id_field(&fields, "task_id")?,
        spread: spread_field(&fields)?,
    })
}

/// `task_shards`, if the body has it: a whole number from 1 to [`MAX_SPREAD`].
fn spread_field(fields: &Map<String, Value>) -> Result<Option<u32>, Poison> {
    let Some(value) = fields.get(SPREAD) else {
        return Ok(None);
    };
    match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
        Some(n) if (1..=MAX_SPREAD).contains(&n) => Ok(Some(n)),
        _ => Err(Poison(format!(
            "{SPREAD} is not a whole number from 1 to {MAX_SPREAD}: {value}"
        ))),
    }
}

/// The worker's own fields, carried by the copy of a message sent again while its host had
/// no room: the start the host's schedule booked for it (ms since the epoch), how many such
/// waits it has had, and when the first began (ms since the epoch). A producer's body has
/// none.
const BOOKING: &str = "polite_start";
const WAITS: &str = "polite_waits";
const SINCE: &str = "polite_since";

/// When the task first waited for its host, if it has.
pub fn polite_since(body: Option<&str>) -> Option<u64> {
    field(body, SINCE)
}

/// The booking a body carries, if any.
pub fn booking(body: Option<&str>) -> Option<u64> {
    field(body, BOOKING)
}

/// The politeness waits a body has had.
pub fn polite_waits(body: Option<&str>) -> u32 {
    count(body, WAITS)
}

/// Carried by the copy of a message sent again after a final attempt that ended for a reason
/// of ours (no time left, a store error), not the page's: the receives earlier copies spent
/// on the task, and how many such copies there have been.
const RECEIVES_BEFORE: &str = "receives_before";
const COPIES: &str = "copies";

/// The receives earlier copies of this message spent (0 for a producer's body).
pub fn receives_before(body: Option<&str>) -> u32 {
    count(body, RECEIVES_BEFORE)
}

/// How many times this message was sent again after a final attempt of ours.
pub fn copies(body: Option<&str>) -> u32 {
    count(body, COPIES)
}

/// When AWS first pushed back on the copies of this message (ms since the epoch), if it has:
/// copies for AWS's push-back are bounded by time, not by their count.
const PRESSED_SINCE: &str = "pressed_since";

/// When the first copy of this message sent for AWS's push-back was sent, if one was.
pub fn pressed_since(body: Option<&str>) -> Option<u64> {
    field(body, PRESSED_SINCE)
}

/// `body` for a copy that has `spent` receives behind it and one copy more; `pressed_at`:
/// AWS pushed back on this one, now (kept from an earlier copy if that was pushed back too).
/// A body that is no JSON object is returned as it is.
pub fn for_another_try(body: &str, spent: u32, pressed_at: Option<u64>) -> String {
    let copies = copies(Some(body)).saturating_add(1);
    let pressed = pressed_since(Some(body)).or(pressed_at);
    let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(body) else {
        return body.to_owned();
    };
    fields.insert(RECEIVES_BEFORE.into(), spent.into());
    fields.insert(COPIES.into(), copies.into());
    if let Some(since) = pressed {
        fields.insert(PRESSED_SINCE.into(), since.into());
    }
    Value::Object(fields).to_string()
}

/// A count the worker keeps in the body (0 when absent; a larger one than fits is the most).
fn count(body: Option<&str>, name: &str) -> u32 {
    field(body, name).map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn field(body: Option<&str>, name: &str) -> Option<u64> {
    let value: Value = serde_json::from_str(body?).ok()?;
    value.get(name)?.as_u64()
}

/// `body` for its next wait: carrying `booked` (or none: an earlier booking is dropped), one
/// wait more, and when the first wait began (`now` if this is the first); a body that is no
/// JSON object is returned as it is.
pub fn for_next_wait(body: &str, booked: Option<u64>, now: u64) -> String {
    let waits = polite_waits(Some(body)).saturating_add(1);
    let since = polite_since(Some(body)).unwrap_or(now);
    let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(body) else {
        return body.to_owned();
    };
    match booked {
        Some(start) => fields.insert(BOOKING.into(), start.into()),
        None => fields.remove(BOOKING),
    };
    fields.insert(WAITS.into(), waits.into());
    fields.insert(SINCE.into(), since.into());
    Value::Object(fields).to_string()
}

fn id_field(fields: &Map<String, Value>, name: &str) -> Result<Id, Poison> {
    match fields.get(name) {
        None => Err(Poison(format!("{name} is missing"))),
        Some(Value::String(raw)) => Id::parse(raw).map_err(|e| Poison(format!("{name} {e}"))),
        Some(_) => Err(Poison(format!("{name} is not a string"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_body_names_its_task_and_ignores_unknown_fields() {
        let task = parse_body(Some(
            r#"{"job_id":"j","run_id":"r","task_id":"t","priority":3}"#,
        ))
        .unwrap();
        assert_eq!(
            (
                task.job_id.as_str(),
                task.run_id.as_str(),
                task.task_id.as_str()
            ),
            ("j", "r", "t")
        );
    }

    #[test]
    fn a_v3_body_names_the_spread_of_its_run_and_its_copies_keep_it() {
        let task = parse_body(Some(
            r#"{"job_id":"j","run_id":"r","task_id":"t","task_shards":16}"#,
        ))
        .unwrap();
        assert_eq!(task.spread, Some(16));
        assert_eq!(parse_body(Some(&body(&task))).unwrap(), task);
        let copy = for_another_try(&body(&task), 4, None);
        assert_eq!(parse_body(Some(&copy)).unwrap().spread, Some(16));
    }

    #[test]
    fn every_malformed_body_is_poison_with_a_reason() {
        let long = "x".repeat(129);
        let cases = [
            (None, "no body"),
            (Some("not json"), "not JSON"),
            (Some(""), "not JSON"),
            (Some("[1,2]"), "not a JSON object"),
            (Some("\"j\""), "not a JSON object"),
            (Some(r#"{"run_id":"r","task_id":"t"}"#), "job_id is missing"),
            (
                Some(r#"{"job_id":"","run_id":"r","task_id":"t"}"#),
                "job_id is empty",
            ),
            (
                Some(r#"{"job_id":"j","run_id":7,"task_id":"t"}"#),
                "run_id is not a string",
            ),
            (
                Some(r#"{"job_id":"j","run_id":"r","task_id":null}"#),
                "task_id is not a string",
            ),
            (
                Some(r#"{"job_id":"j","run_id":"r","task_id":"a/b"}"#),
                "task_id has a character",
            ),
            (
                Some(r#"{"job_id":"j","run_id":"r","task_id":"t","task_shards":0}"#),
                "task_shards is not a whole number",
            ),
            (
                Some(r#"{"job_id":"j","run_id":"r","task_id":"t","task_shards":"8"}"#),
                "task_shards is not a whole number",
            ),
            (
                Some(r#"{"job_id":"j","run_id":"r","task_id":"t","task_shards":70000}"#),
                "task_shards is not a whole number",
            ),
        ];
        for (body, expected) in cases {
            let poison = parse_body(body).unwrap_err();
            assert!(poison.0.contains(expected), "{body:?}: {poison}");
        }
        let too_long = format!(r#"{{"job_id":"{long}","run_id":"r","task_id":"t"}}"#);
        assert!(
            parse_body(Some(&too_long))
                .unwrap_err()
                .0
                .contains("longer than 128")
        );
    }

    #[test]
    fn a_booking_and_the_waits_ride_along_the_body_and_leave_the_task_as_it_was() {
        let body = r#"{"job_id":"j","run_id":"r","task_id":"t","extra":1}"#;

        let booked = for_next_wait(body, Some(1_700_000_000_000), 5);
        let unbooked = for_next_wait(&booked, None, 9);

        assert_eq!(booking(Some(&booked)), Some(1_700_000_000_000));
        assert_eq!(
            polite_since(Some(&unbooked)),
            Some(5),
            "the first wait's start"
        );
        assert_eq!(polite_since(Some(body)), None);
        assert_eq!(parse_body(Some(&booked)), parse_body(Some(body)));
        assert_eq!(booking(Some(&unbooked)), None);
        assert_eq!(
            (polite_waits(Some(body)), polite_waits(Some(&unbooked))),
            (0, 2)
        );
        assert_eq!(for_next_wait("not json", Some(1), 5), "not json");
    }

    #[test]
    fn a_copy_carries_the_receives_spent_and_counts_itself() {
        let body = r#"{"job_id":"j","run_id":"r","task_id":"t"}"#;

        let first = for_another_try(body, 4, None);
        let second = for_another_try(&first, 4, None);

        assert_eq!(parse_body(Some(&second)), parse_body(Some(body)));
        assert_eq!((receives_before(Some(body)), copies(Some(body))), (0, 0));
        assert_eq!(
            (receives_before(Some(&second)), copies(Some(&second))),
            (4, 2)
        );
        assert_eq!(for_another_try("not json", 4, None), "not json");
    }

    #[test]
    fn a_copy_keeps_when_aws_first_pushed_back_on_its_copies() {
        let body = r#"{"job_id":"j","run_id":"r","task_id":"t"}"#;

        let out_of_time = for_another_try(body, 4, None);
        let pushed_back = for_another_try(&out_of_time, 4, Some(1_000));
        let again = for_another_try(&pushed_back, 4, Some(9_000));
        let then_out_of_time = for_another_try(&again, 4, None);

        assert_eq!(pressed_since(Some(&out_of_time)), None);
        assert_eq!(pressed_since(Some(&pushed_back)), Some(1_000));
        assert_eq!(
            pressed_since(Some(&again)),
            Some(1_000),
            "the first push-back's"
        );
        assert_eq!(pressed_since(Some(&then_out_of_time)), Some(1_000));
        assert_eq!(parse_body(Some(&then_out_of_time)), parse_body(Some(body)));
    }
}
