//! An SQS message, parsed once: the task it names, and what the worker's own copies carry.
//! The table gives the rule for each way a message can come to be.
//!
//! | comes from | how the worker tells | what it carries |
//! |---|---|---|
//! | a producer's message | no `copied_at` | nothing: its tries begin when it was sent |
//! | a copy parked for its host's turn | `copied_at` about when SQS took it | the booked start, the wait count plus one, when the first wait began; the rest unchanged |
//! | a copy parked for its run's paid budget | as above | as a copy parked for its host, and the paid waits plus one: it goes straight to the paid tier |
//! | a copy sent because AWS pushed back, or for a final attempt | as above | the receives used so far, the copy count plus one, when AWS first pushed back (kept from earlier copies); the rest unchanged |
//! | a copy sent part way through the task's redirects (any of the copies above) | as above | as above, and `hops`: the next URL, the URLs before it, whether it is fetched in full (`domain::hops`) |
//! | a copy moved to the back of its FIFO group (to wait, or because it is held behind its group, on its second-to-last receive) | as a parked copy | what it carried |
//! | a task handed over to the renderer (`render: always`, or `auto` and an application shell) | `render_reason` | why (`always`, or the shell rule), and what it carried but a booking; its tries go on |
//! | `conveyor-ops requeue-failed` | a producer's body (the task's attempts are reset too) | nothing |
//! | `conveyor-ops redrive --move` | [`Message::redriven`]: the task's fields alone | nothing |
//! | SQS's own redrive (a message move task) | `copied_at` more than [`REDRIVE_GAP`] before SQS took it | nothing: what it carried is dropped, so its tries start afresh |
//!
//! Every copy keeps the producer's own fields, its `MessageGroupId` and its message
//! attributes. The worker's part is in `worker/park.rs`. A worker field that is not a whole
//! number reads as absent. A body from the previous release reads the same way, since the
//! field names did not change; it has no `paid_waits`, which reads as 0. The previous
//! release reads a body of this one too: it ignores fields it does not know, and its copies
//! keep them as the producer's (`tests/fixtures/messages/`).

use serde_json::{Map, Value};

use crate::domain::hops::{HOPS, Hops};
use crate::domain::ids::{Id, MAX_SPREAD, TaskRef};

/// A body that can never name a task. Redelivering it would only use up receives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Poison(pub String);

/// If SQS took a copy this much later than the worker wrote it, the worker did not send it.
/// It is a redrive from the dead-letter queue. The worker sends its own copies as soon as it
/// writes them, and a message reaches the dead-letter queue at least minutes after its last
/// copy.
pub const REDRIVE_GAP_MS: u64 = 60_000;

/// [`REDRIVE_GAP_MS`], as the docs name it.
pub const REDRIVE_GAP: std::time::Duration = std::time::Duration::from_millis(REDRIVE_GAP_MS);

/// What the worker's own copies carry besides the task. All absent in a producer's body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// The start its host's schedule booked for it (ms since the epoch).
    pub booking: Option<u64>,
    /// The politeness waits it has had, and when the first began (ms since the epoch).
    pub waits: u32,
    pub polite_since: Option<u64>,
    /// The receives earlier copies spent on the task.
    pub receives_before: u32,
    /// How many copies were sent for another try: after a final attempt that ended for a
    /// reason on our side, or after AWS pushed back.
    pub copies: u32,
    /// When AWS first pushed back on its copies (ms since the epoch).
    pub pressed_since: Option<u64>,
    /// When the worker sent this copy (ms since the epoch).
    pub copied_at: Option<u64>,
    /// When the task's current set of tries began: when the first message in this chain of
    /// copies was sent (ms since the epoch).
    pub tries_since: Option<u64>,
    /// How many of its waits were for its run's paid budget. Once it has had one, the other
    /// tiers are known to block its page, and it goes straight to the paid tier.
    pub paid_waits: u32,
}

/// The body field for each carried value. The names are the same as in the previous release.
const BOOKING: &str = "polite_start";
const WAITS: &str = "polite_waits";
const SINCE: &str = "polite_since";
const RECEIVES_BEFORE: &str = "receives_before";
const COPIES: &str = "copies";
const PRESSED_SINCE: &str = "pressed_since";
const COPIED_AT: &str = "copied_at";
const TRIES_SINCE: &str = "tries_since";
const PAID_WAITS: &str = "paid_waits";
const CARRIED: [&str; 9] = [
    BOOKING,
    WAITS,
    SINCE,
    RECEIVES_BEFORE,
    COPIES,
    PRESSED_SINCE,
    COPIED_AT,
    TRIES_SINCE,
    PAID_WAITS,
];

/// Why a task was handed over to the renderer: `always`, or the application shell rule its
/// page met. Set on the renderer's copy only.
const RENDER_REASON: &str = "render_reason";

/// The longest `render_reason` read, in bytes (a shell rule's bound).
const MAX_RENDER_REASON: usize = 64;

/// Data contract v3: the run's `counter_shards`, over which its tasks and results spread.
const SPREAD: &str = "task_shards";

/// A message as the worker reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub task: TaskRef,
    pub carried: Carried,
    /// SQS took it again long after the worker wrote it, so what it carried was dropped.
    pub redriven: bool,
    /// Where the task's redirects have led, when a copy was sent part way through them.
    /// The worker's copies of this message carry it as it is set when they are sent.
    pub hops: Option<Hops>,
    /// The body's fields as they came, the producer's own ones included.
    fields: Map<String, Value>,
}

impl Message {
    /// Reads a body sent at `sent_at`: SQS's `SentTimestamp` in ms since the epoch, if known.
    pub fn parse(body: Option<&str>, sent_at: Option<u64>) -> Result<Self, Poison> {
        let fields = object(body)?;
        let task = task_of(&fields)?;
        let mut carried = Carried::of(&fields);
        let mut hops = Hops::of(&fields);
        let redriven = matches!((carried.copied_at, sent_at),
            (Some(copied), Some(sent)) if sent > copied.saturating_add(REDRIVE_GAP_MS));
        if redriven {
            (carried, hops) = (Carried::default(), None);
        }
        carried.tries_since = carried.tries_since.or(sent_at);
        Ok(Self {
            task,
            carried,
            redriven,
            hops,
            fields,
        })
    }

    /// The body of a copy parked for its host's turn. It carries `booked` (or none), one
    /// more wait, and when the first wait began (`now` if this is the first).
    pub fn parked(&self, booked: Option<u64>, now: u64) -> String {
        let carried = Carried {
            booking: booked,
            waits: self.carried.waits.saturating_add(1),
            polite_since: self.carried.polite_since.or(Some(now)),
            copied_at: Some(now),
            ..self.carried
        };
        self.with(carried)
    }

    /// The body of a copy parked for its run's paid budget, held elsewhere: as
    /// [`Message::parked`] with no booking, and one more paid wait.
    pub fn parked_for_paid(&self, now: u64) -> String {
        let carried = Carried {
            paid_waits: self.carried.paid_waits.saturating_add(1),
            ..self.carried
        };
        Self {
            carried,
            ..self.clone()
        }
        .parked(None, now)
    }

    /// The body of a copy sent for another try. It carries `spent` receives used so far and
    /// one more copy. It carries `pressed_at` if AWS pushed back on this one, unless an
    /// earlier copy already set that start, which is kept.
    pub fn another_try(&self, spent: u32, pressed_at: Option<u64>, now: u64) -> String {
        let carried = Carried {
            receives_before: spent,
            copies: self.carried.copies.saturating_add(1),
            pressed_since: self.carried.pressed_since.or(pressed_at),
            copied_at: Some(now),
            ..self.carried
        };
        self.with(carried)
    }

    /// The body of a copy moved to the back of its FIFO group, carrying what it carried.
    pub fn moved(&self, now: u64) -> String {
        let carried = Carried {
            copied_at: Some(now),
            ..self.carried
        };
        self.with(carried)
    }

    /// The body an operator's redrive sends: the producer's fields alone, for a fresh set of
    /// tries.
    pub fn redriven(&self) -> String {
        Self {
            hops: None,
            ..self.clone()
        }
        .with(Carried::default())
    }

    /// The body of the task handed over to the renderer because of `reason`: what it
    /// carried (its tries go on) but a booking, which was its host's start for this worker.
    pub fn handed_over(&self, reason: &str, now: u64) -> String {
        let carried = Carried {
            booking: None,
            copied_at: Some(now),
            ..self.carried
        };
        let mut fields = self.fields_with(carried);
        fields.insert(RENDER_REASON.into(), reason.into());
        Value::Object(fields).to_string()
    }

    /// Why the task was handed over to the renderer, if it was: a text of at most 64 bytes.
    pub fn render_reason(&self) -> Option<&str> {
        let reason = self.fields.get(RENDER_REASON)?.as_str()?;
        (!reason.is_empty() && reason.len() <= MAX_RENDER_REASON).then_some(reason)
    }

    /// The body with the producer's fields as they came and `carried` as the worker's.
    fn with(&self, carried: Carried) -> String {
        Value::Object(self.fields_with(carried)).to_string()
    }

    /// The producer's fields as they came and `carried` as the worker's.
    fn fields_with(&self, carried: Carried) -> Map<String, Value> {
        let mut fields = self.fields.clone();
        for name in CARRIED.into_iter().chain([HOPS]) {
            fields.remove(name);
        }
        if let Some(hops) = &self.hops {
            fields.insert(HOPS.into(), hops.to_value());
        }
        let numbers = [
            (BOOKING, carried.booking),
            (WAITS, Some(u64::from(carried.waits)).filter(|&n| n > 0)),
            (SINCE, carried.polite_since),
            (RECEIVES_BEFORE, Some(u64::from(carried.receives_before))),
            (COPIES, Some(u64::from(carried.copies))),
            (PRESSED_SINCE, carried.pressed_since),
            (COPIED_AT, carried.copied_at),
            (TRIES_SINCE, carried.tries_since),
            (
                PAID_WAITS,
                Some(u64::from(carried.paid_waits)).filter(|&n| n > 0),
            ),
        ];
        if carried != Carried::default() {
            for (name, value) in numbers {
                if let Some(value) = value {
                    fields.insert(name.into(), value.into());
                }
            }
        }
        fields
    }
}

impl Carried {
    /// What a body carries, as written. All absent for a body that is not a JSON object.
    pub fn read(body: Option<&str>) -> Self {
        object(body).map_or_else(|_| Self::default(), |fields| Self::of(&fields))
    }

    fn of(fields: &Map<String, Value>) -> Self {
        let number = |name: &str| fields.get(name).and_then(Value::as_u64);
        let count = |name: &str| number(name).map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        Self {
            booking: number(BOOKING),
            waits: count(WAITS),
            polite_since: number(SINCE),
            receives_before: count(RECEIVES_BEFORE),
            copies: count(COPIES),
            pressed_since: number(PRESSED_SINCE),
            copied_at: number(COPIED_AT),
            tries_since: number(TRIES_SINCE),
            paid_waits: count(PAID_WAITS),
        }
    }
}

/// The body a producer sends for `task`.
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

/// The task a body names: `{"job_id": "...", "run_id": "...", "task_id": "..."}` and, in
/// data contract v3, `"task_shards": N`. Unknown fields are ignored.
pub fn parse_body(body: Option<&str>) -> Result<TaskRef, Poison> {
    task_of(&object(body)?)
}

fn object(body: Option<&str>) -> Result<Map<String, Value>, Poison> {
    let body = body.ok_or_else(|| Poison("the message has no body".into()))?;
    let value: Value =
        serde_json::from_str(body).map_err(|e| Poison(format!("the body is not JSON: {e}")))?;
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err(Poison("the body is not a JSON object".into())),
    }
}

fn task_of(fields: &Map<String, Value>) -> Result<TaskRef, Poison> {
    Ok(TaskRef {
        job_id: id_field(fields, "job_id")?,
        run_id: id_field(fields, "run_id")?,
        task_id: id_field(fields, "task_id")?,
        spread: spread_field(fields)?,
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

    const BODY: &str = r#"{"job_id":"j","run_id":"r","task_id":"t","tenant":"acme"}"#;

    fn read(body: &str, sent_at: Option<u64>) -> Message {
        Message::parse(Some(body), sent_at).expect("a well-formed body")
    }

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
        let copy = read(&body(&task), None).another_try(4, None, 9);
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
            let poison = Message::parse(body, None).unwrap_err();
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
    fn a_producers_message_carries_nothing_and_its_tries_begin_when_it_was_sent() {
        let message = read(BODY, Some(1_000));

        assert_eq!(
            message.carried,
            Carried {
                tries_since: Some(1_000),
                ..Carried::default()
            }
        );
        assert!(!message.redriven);
    }

    #[test]
    fn a_parked_copy_carries_its_booking_and_waits_and_the_producers_fields() {
        let producer = read(BODY, Some(1_000));

        let first = producer.parked(Some(1_700_000_000_000), 5_000);
        let second = read(&first, Some(5_000)).parked(None, 9_000);

        let first = read(&first, Some(5_000));
        let second = read(&second, Some(9_000));
        assert_eq!(first.carried.booking, Some(1_700_000_000_000));
        assert_eq!(
            second.carried.booking, None,
            "an earlier booking is dropped"
        );
        assert_eq!((first.carried.waits, second.carried.waits), (1, 2));
        assert_eq!(second.carried.polite_since, Some(5_000), "the first wait's");
        assert_eq!(second.carried.tries_since, Some(1_000), "the line's first");
        assert_eq!(second.task, producer.task);
        assert_eq!(second.fields["tenant"], "acme");
    }

    #[test]
    fn a_copy_for_another_try_counts_itself_and_keeps_the_first_push_back() {
        let producer = read(BODY, Some(1_000));

        let out_of_time = read(&producer.another_try(4, None, 2_000), Some(2_000));
        let pushed_back = read(&out_of_time.another_try(4, Some(3_000), 3_000), Some(3_000));
        let again = read(&pushed_back.another_try(4, Some(9_000), 9_000), Some(9_000));

        assert_eq!(out_of_time.carried.pressed_since, None);
        assert_eq!(pushed_back.carried.pressed_since, Some(3_000));
        assert_eq!(
            again.carried.pressed_since,
            Some(3_000),
            "the first push-back's"
        );
        assert_eq!(
            (again.carried.receives_before, again.carried.copies),
            (4, 3)
        );
        assert_eq!(again.task, producer.task);
    }

    #[test]
    fn a_copy_sqs_took_long_after_the_worker_wrote_it_is_a_redrive_with_fresh_tries() {
        let copy = read(BODY, Some(1_000)).another_try(4, Some(2_000), 2_000);

        let on_time = read(&copy, Some(2_000 + REDRIVE_GAP_MS));
        let redriven = read(&copy, Some(2_001 + REDRIVE_GAP_MS));

        assert!(!on_time.redriven);
        assert_eq!(on_time.carried.receives_before, 4);
        assert!(redriven.redriven);
        assert_eq!(
            redriven.carried,
            Carried {
                tries_since: Some(2_001 + REDRIVE_GAP_MS),
                ..Carried::default()
            }
        );
    }

    #[test]
    fn an_operators_redrive_sends_the_producers_fields_alone() {
        let copy = read(BODY, Some(1_000)).parked(Some(7), 2_000);

        let redriven = read(&read(&copy, None).redriven(), None);

        assert_eq!(redriven.carried, Carried::default());
        assert_eq!(redriven.fields, read(BODY, None).fields);
    }

    #[test]
    fn the_previous_releases_bodies_read_as_they_were_written() {
        let fixture = |name| match name {
            "producer" => include_str!("../../tests/fixtures/messages/producer.json"),
            "parked" => include_str!("../../tests/fixtures/messages/parked.json"),
            "final_attempt_copy" => {
                include_str!("../../tests/fixtures/messages/final_attempt_copy.json")
            }
            _ => include_str!("../../tests/fixtures/messages/pressed_copy.json"),
        };
        let carried = |name| read(fixture(name), Some(1_764_749_000_000)).carried;

        assert_eq!(read(fixture("producer"), None).task.spread, Some(16));
        assert_eq!(carried("parked").booking, Some(1_764_748_800_000));
        assert_eq!(carried("parked").waits, 2);
        assert_eq!(carried("parked").polite_since, Some(1_764_745_200_000));
        assert_eq!(carried("final_attempt_copy").receives_before, 4);
        assert_eq!(carried("final_attempt_copy").copies, 1);
        let pressed = carried("pressed_copy");
        assert_eq!(pressed.pressed_since, Some(1_764_741_600_000));
        assert_eq!((pressed.receives_before, pressed.copies), (4, 3));
        assert_eq!(
            pressed.tries_since,
            Some(1_764_749_000_000),
            "when SQS took it"
        );
        let copy = read(fixture("pressed_copy"), None).another_try(4, None, 1);
        assert_eq!(read(&copy, None).fields["tenant"], "acme");
        assert_eq!(
            carried("parked").paid_waits,
            0,
            "no paid wait: free tiers first"
        );
    }

    #[test]
    fn a_copy_parked_for_the_paid_budget_counts_its_waits_and_reads_as_written() {
        // Arrange: a producer's body, and the fixture of such a copy as this release writes
        // it (the previous release reads it as a parked copy, keeping `paid_waits` as a
        // field of the producer's).
        let fixture = include_str!("../../tests/fixtures/messages/paid_wait_copy.json");

        // Act
        let once = read(BODY, None).parked_for_paid(1_000);
        let twice = read(&once, None).parked_for_paid(2_000);

        // Assert
        let carried = read(&twice, None).carried;
        assert_eq!((carried.paid_waits, carried.waits), (2, 2));
        assert_eq!(carried.polite_since, Some(1_000));
        assert_eq!(carried.booking, None);
        let written = read(fixture, None).carried;
        assert_eq!((written.paid_waits, written.waits), (1, 3));
        assert_eq!(written.polite_since, Some(1_764_745_200_000));
        assert_eq!(read(fixture, None).fields["tenant"], "acme");
    }

    #[test]
    fn a_task_handed_over_says_why_keeps_its_tries_and_drops_its_booking() {
        // Arrange: a copy booked on its host, and the fixture of a handed-over body.
        let fixture = include_str!("../../tests/fixtures/messages/handed_over.json");
        let booked = read(BODY, Some(1_000)).parked(Some(9_000), 2_000);

        // Act
        let handed = read(&booked, Some(2_001)).handed_over("mount node", 3_000);
        let long = read(BODY, None).handed_over(&"x".repeat(65), 3_000);

        // Assert
        let handed = read(&handed, Some(3_001));
        assert_eq!(handed.render_reason(), Some("mount node"));
        assert_eq!(handed.carried.booking, None);
        assert_eq!(handed.carried.tries_since, Some(1_000));
        assert_eq!(handed.carried.waits, 1);
        assert_eq!(handed.fields["tenant"], "acme");
        assert_eq!(read(&long, None).render_reason(), None, "over 64 bytes");
        assert_eq!(read(BODY, None).render_reason(), None);
        let written = read(fixture, None);
        assert_eq!(written.render_reason(), Some("mount node"));
        assert_eq!(written.carried.tries_since, Some(1_764_745_100_000));
    }

    #[test]
    fn a_copy_sent_part_way_through_redirects_carries_its_hops_and_reads_as_written() {
        // Arrange: the fixture of such a copy as this release writes it, and a producer's
        // body whose task was redirected once.
        let fixture = include_str!("../../tests/fixtures/messages/redirect_copy.json");
        let mut producer = read(BODY, None);
        producer.hops = Some(Hops {
            next: "https://b.example/".into(),
            before: vec!["http://a.example/".into()],
            in_full: false,
        });

        // Act
        let parked = read(&producer.parked(Some(9), 1_000), None);
        let again = read(&parked.another_try(2, None, 2_000), None);
        let moved = read(&again.moved(3_000), None);
        let redriven = read(&moved.redriven(), None);

        // Assert: every copy carries the chain on; an operator's redrive starts afresh.
        assert_eq!(moved.hops, producer.hops);
        assert_eq!(redriven.hops, None);
        let written = read(fixture, Some(1_764_748_700_000));
        let hops = written.hops.expect("the fixture's hops");
        assert_eq!(hops.next, "https://shop.example/page/1");
        assert_eq!(hops.before, ["http://sho.rt/x1"]);
        assert_eq!(written.carried.booking, Some(1_764_748_800_000));
        assert_eq!(written.fields["tenant"], "acme");
        assert_eq!(read(BODY, None).hops, None, "a producer's body has none");
    }

    /// What the previous release (bf0ec71) reads of a body: the task's three ids (strings),
    /// and these numbers (`Value::as_u64`; anything else reads as absent). It ignores other
    /// fields and keeps them in its own copies.
    const PREVIOUS_RELEASE_READS: [&str; 7] = [
        "polite_start",
        "polite_waits",
        "polite_since",
        "receives_before",
        "copies",
        "pressed_since",
        "task_shards",
    ];

    #[test]
    fn the_previous_release_reads_this_releases_copies_as_they_were_meant() {
        // Arrange: a producer's body, as this release's copies of it carry it on.
        let producer = read(BODY, Some(1_000));
        let parked = producer.parked(Some(9_000), 2_000);
        let pushed_back = read(&parked, Some(2_001)).another_try(4, Some(3_000), 3_000);

        // Act: each copy's fields as the previous release reads them.
        let fields = |body: &str| -> Map<String, Value> {
            serde_json::from_str(body).expect("a JSON object")
        };
        let (parked, pushed_back) = (fields(&parked), fields(&pushed_back));

        // Assert: ids are strings, every number it reads is a whole number where this
        // release meant one, and it reads the values this release carries.
        for copy in [&parked, &pushed_back] {
            for id in ["job_id", "run_id", "task_id"] {
                assert!(copy[id].is_string(), "{id} in {copy:?}");
            }
            for name in PREVIOUS_RELEASE_READS {
                let value = copy.get(name);
                assert!(
                    value.is_none_or(|v| v.as_u64().is_some()),
                    "{name} in {copy:?}"
                );
            }
        }
        assert_eq!(parked["polite_start"].as_u64(), Some(9_000));
        assert_eq!(parked["polite_waits"].as_u64(), Some(1));
        assert_eq!(parked["polite_since"].as_u64(), Some(2_000));
        assert_eq!(pushed_back["receives_before"].as_u64(), Some(4));
        assert_eq!(pushed_back["copies"].as_u64(), Some(1));
        assert_eq!(pushed_back["pressed_since"].as_u64(), Some(3_000));
        assert_eq!(pushed_back["polite_since"].as_u64(), Some(2_000), "kept");
    }
}
