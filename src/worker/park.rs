//! Stage 7, park: where a record goes when it is not finished here. It may be sent again as
//! a fresh copy, to wait for its host's turn or for a last try. It may be held back through
//! its visibility timeout. A poison body goes to quarantine. A lease may be given back.

use crate::batch::{Handoffs, NotSent};
use crate::contract::{Outcome, Reply, WaitFor};
use crate::domain::ids::{QuarantineKey, REPLAYED_FROM, TaskRef};
use crate::domain::message::{Carried, Message, Poison};
use crate::domain::time::{epoch_millis, rfc3339};
use crate::polite::MAX_POLITE_HOLD;
use crate::ports::error::StoreFault;
use crate::ports::queue::{Attribute, MessageCopy, QueueRef, SQS_MAX_DELAY, Visibility};
use crate::ports::results::ResultStore;
use crate::ports::tasks::TaskStore;
use crate::pushback::pressure::Pressure;
use crate::trace;
use aws_lambda_events::event::sqs::SqsMessage;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

use super::context::{Delivery, RecordSettings};
use super::sqs_record::{name_span, on_fifo, receive_count, sent_at};

/// How many copies a message may get after final attempts that ended for reasons on our
/// side. After that, it meets the queue's redrive policy like any other message.
pub const MAX_COPIES: u32 = 10;

/// How long copies are sent for a record that AWS keeps pushing back on, counted from its
/// first such copy. It is long enough for a new table to double its rate a few times (30
/// minutes each), or for a hot key to split.
pub const PRESSED_COPIES_FOR: Duration = Duration::from_secs(2 * 3_600);

/// What parking a record uses: the queue, the task's lease, the quarantine, and the
/// sandbox's pressure (AWS push-back).
pub(super) struct Park<'a, T, R, V> {
    pub tasks: &'a T,
    pub results: &'a R,
    pub visibility: &'a V,
    pub settings: &'a RecordSettings,
    pub pressure: &'a Pressure,
}

impl<T: TaskStore, R: ResultStore, V: Visibility> Park<'_, T, R, V> {
    /// Where the record goes after its outcome: a parked copy for its host's turn, the
    /// lease given up, a copy for a last try, the back of its FIFO group, or a hold through
    /// its visibility timeout. The outcome, updated with what was done, goes into the reply.
    pub async fn park(
        &self,
        record: &SqsMessage,
        (delivery, handoffs): (&Delivery, &Handoffs),
        outcome: Outcome,
    ) -> Outcome {
        let (message, receives, handoffs) = (&delivery.message, delivery.receives, Some(handoffs));
        let outcome = self.hand_over(record, message, outcome).await;
        let outcome = self
            .requeue_politely(record, message, outcome, handoffs)
            .await;
        if let Some(owner) = delivery.owner.as_deref()
            && ends_without_terminal_write(&outcome)
        {
            self.release(delivery.task(), owner).await;
        }
        let outcome = self
            .send_again(record, (message, handoffs), outcome, receives)
            .await;
        let outcome = self
            .to_back_of_group(record, (message, handoffs), outcome)
            .await;
        if let Some(delay) = self.hold_for(&outcome, receives, message.carried.copies) {
            self.hold(record, delay).await;
        }
        outcome
    }

    /// A record whose host has no room is sent again as a fresh copy, due after its wait (at
    /// most SQS's 15 minutes). So waiting uses up no receive toward the dead-letter queue. A
    /// longer wait is held through the visibility timeout instead (up to
    /// [`MAX_POLITE_HOLD`]), on the first receive of a copy that carries its booking. So a
    /// day-long wait costs only a copy or two. Later receives send a fresh copy again. No
    /// copy is sent on a FIFO queue, where it would lose its place, except on the receive
    /// before the last; that copy goes to the back of its group, due at once. If the copy
    /// cannot be sent, the record is held back instead.
    async fn requeue_politely(
        &self,
        record: &SqsMessage,
        message: &Message,
        outcome: Outcome,
        handoffs: Option<&Handoffs>,
    ) -> Outcome {
        let Outcome::WaitHeld {
            delay,
            booked,
            waits_for,
        } = outcome
        else {
            return outcome;
        };
        let arn = record.event_source_arn.as_deref().unwrap_or_default();
        let Some(queue) = QueueRef::from_arn(arn) else {
            return outcome;
        };
        let carries_booking = booked.is_some() && message.carried.booking == booked;
        let first_receive = receive_count(record) == 1;
        let fifo = on_fifo(record);
        if (fifo && !self.at_last_receive(record))
            || (delay > SQS_MAX_DELAY && carries_booking && first_receive)
        {
            return outcome;
        }
        let now = epoch_millis(SystemTime::now()) as u64;
        let body = match waits_for {
            WaitFor::PaidBudget => message.parked_for_paid(now),
            WaitFor::Host => message.parked(booked, now),
        };
        let copy = copy_of(record, body, delay);
        let then = move || Outcome::WaitCopied { delay };
        match self.carry_on(record, handoffs, (&queue, copy), then).await {
            Ok(requeued) => requeued,
            Err(err) => {
                tracing::warn!(error = %err, "could not send the held record again; held back instead");
                outcome
            }
        }
    }

    /// A record held behind an earlier record of its FIFO group. On the receive before its
    /// last (the next would move it to the dead-letter queue untried), it is instead sent
    /// again as a fresh copy to the back of its group, carrying what it carried. Otherwise
    /// it becomes visible again at once. SQS delivers nothing from the group while the
    /// earlier record is held, so the group waits only for that record's hold, not for the
    /// queue's timeout.
    pub async fn held_in_group(&self, record: &SqsMessage) -> Outcome {
        let now = epoch_millis(SystemTime::now()) as u64;
        let outcome = match Message::parse(record.body.as_deref(), sent_at(record)) {
            Ok(message) => {
                name_span(&message.task);
                self.move_to_back(record, (message.moved(now), None), Outcome::GroupHeld)
                    .await
            }
            Err(_) => Outcome::GroupHeld,
        };
        if matches!(outcome, Outcome::GroupHeld) {
            self.hold(record, Duration::ZERO).await;
        }
        outcome
    }

    /// A FIFO record to retry on the receive before its last is sent again as one more copy
    /// to the back of its group, due at once. Then its message's receives, which its waits
    /// used up, do not dead-letter a task that still has tries left; the task's claims count
    /// its tries. At most [`MAX_FIFO_MOVES`] such copies are sent. So a task whose tries go
    /// to failures on our side still reaches the dead-letter queue within a few rounds of
    /// receives, and its group is not held behind it for long.
    async fn to_back_of_group(
        &self,
        record: &SqsMessage,
        (message, handoffs): (&Message, Option<&Handoffs>),
        outcome: Outcome,
    ) -> Outcome {
        let retry = outcome.reply() == Reply::Retry;
        if !on_fifo(record) || !retry || message.carried.copies >= MAX_FIFO_MOVES {
            return outcome;
        }
        let now = epoch_millis(SystemTime::now()) as u64;
        let spent = message.carried.receives_before;
        let body = message.another_try(spent, None, now);
        self.move_to_back(record, (body, handoffs), outcome).await
    }

    /// On the receive before its last (the next would move it to the dead-letter queue),
    /// sends `body` to the back of the record's FIFO group. Otherwise, or if it cannot be
    /// sent, `outcome` stays as it is.
    async fn move_to_back(
        &self,
        record: &SqsMessage,
        (body, handoffs): (String, Option<&Handoffs>),
        outcome: Outcome,
    ) -> Outcome {
        let arn = record.event_source_arn.as_deref().unwrap_or_default();
        let (Some(queue), true) = (QueueRef::from_arn(arn), self.at_last_receive(record)) else {
            return outcome;
        };
        let copy = copy_of(record, body, Duration::ZERO);
        let then = || Outcome::SentAgain {
            delay: Duration::ZERO,
        };
        match self.carry_on(record, handoffs, (&queue, copy), then).await {
            Ok(moved) => moved,
            Err(err) => {
                tracing::warn!(error = %err, "could not move the record to the back of its group");
                outcome
            }
        }
    }

    /// Whether holding this record would leave its message one receive from the dead-letter
    /// queue (the redrive policy's `maxReceiveCount`, deployed as `MAX_ATTEMPTS`).
    fn at_last_receive(&self, record: &SqsMessage) -> bool {
        receive_count(record) + 1 >= self.settings.max_attempts
    }

    /// A record that the batch's cutoff stopped before it ended, or before it started (a
    /// batch larger than its concurrency, or records the sandbox's pressure held back). On
    /// its final receive it is sent again as a fresh copy, since it did not get its try.
    /// Otherwise it goes back to the queue. While the sandbox is strained, its copy counts
    /// as a push-back copy: limited by time, and due after the pressed hold, not at once.
    pub async fn out_of_time(&self, record: &SqsMessage) -> Outcome {
        let Ok(message) = Message::parse(record.body.as_deref(), sent_at(record)) else {
            return Outcome::OutOfTime;
        };
        let receives = receive_count(record) + message.carried.receives_before;
        self.send_again(record, (&message, None), Outcome::OutOfTime, receives)
            .await
    }

    /// A final attempt that ended for a reason on our side, not the page's (too little time
    /// left to fetch, a store error, the batch's cutoff), is sent again as a fresh copy. The
    /// copy carries the receives used before it, so the task still gets its last try instead
    /// of going to the dead-letter queue. Copies are limited to [`MAX_COPIES`]. For AWS
    /// push-back, and for records the strained sandbox did not start, the limit is time
    /// instead: [`PRESSED_COPIES_FOR`] from the first such copy. No copy is sent on a FIFO
    /// queue. If the copy cannot be sent, the outcome stays as it is, and the message comes
    /// back and meets the redrive policy.
    async fn send_again(
        &self,
        record: &SqsMessage,
        (message, handoffs): (&Message, Option<&Handoffs>),
        outcome: Outcome,
        receives: u32,
    ) -> Outcome {
        let ours = matches!(
            outcome,
            Outcome::NoTimeLeft | Outcome::OutOfTime | Outcome::Store(_)
        );
        let arn = record.event_source_arn.as_deref().unwrap_or_default();
        let now = epoch_millis(SystemTime::now()) as u64;
        let pressed = self.pressed(&outcome);
        if !ours
            || receives < self.settings.max_attempts
            || on_fifo(record)
            || !may_copy(&message.carried, pressed, now)
        {
            return outcome;
        }
        let Some(queue) = QueueRef::from_arn(arn) else {
            return outcome;
        };
        let copies = message.carried.copies;
        let delay = match pressed {
            true => self.pressed_hold(receives, copies),
            false => self
                .hold_for(&outcome, receives, copies)
                .unwrap_or_default(),
        };
        // This receive did not try the page: it is not counted.
        let body = message.another_try(receives.saturating_sub(1), pressed.then_some(now), now);
        let copy = copy_of(record, body, delay);
        let then = move || Outcome::SentAgain { delay };
        match self.carry_on(record, handoffs, (&queue, copy), then).await {
            Ok(sent) => sent,
            Err(err) => {
                tracing::warn!(error = %err, "could not send the final attempt again");
                outcome
            }
        }
    }

    /// Sends the copy that carries the record's message on; `then` is the outcome that gives
    /// the record. Within an invocation the send goes through its handoffs: once the copy is
    /// sent, that outcome holds even if the cutoff stops the record, and after the cutoff no
    /// copy starts. `Err`: not sent, and why.
    async fn carry_on(
        &self,
        record: &SqsMessage,
        handoffs: Option<&Handoffs>,
        (queue, copy): (&QueueRef, MessageCopy),
        then: impl Fn() -> Outcome + Send + Sync + 'static,
    ) -> Result<Outcome, String> {
        let send = self.visibility.requeue(queue, &copy);
        let Some(handoffs) = handoffs else {
            return send.await.map(|()| then()).map_err(|err| err.to_string());
        };
        let message_id = record.message_id.as_deref().unwrap_or_default();
        match handoffs.send(message_id, send, then).await {
            Ok(outcome) => Ok(outcome),
            Err(NotSent::Cut) => Err("the invocation's cutoff passed".into()),
            Err(NotSent::Failed(err)) => Err(err.to_string()),
        }
    }

    /// Whether `outcome` was caused by AWS push-back: a store error from it, or a record the
    /// cutoff stopped while the sandbox's pressure was strained (held back, not tried).
    fn pressed(&self, outcome: &Outcome) -> bool {
        match outcome {
            Outcome::OutOfTime => self.pressure.strain() > 1.0,
            outcome => pushed_back(outcome),
        }
    }

    /// Keeps a poison message in S3 before it is acknowledged; if that fails, it is retried
    /// rather than lost.
    pub async fn quarantine(&self, record: &SqsMessage, poison: Poison) -> Outcome {
        let prefix = &self.settings.quarantine_prefix;
        let replayed = record
            .message_attributes
            .get(REPLAYED_FROM)
            .and_then(|attribute| attribute.string_value.as_deref())
            .and_then(|key| QuarantineKey::replayed(prefix, key));
        let message_id = record.message_id.as_deref().unwrap_or_default();
        let key = replayed.unwrap_or_else(|| QuarantineKey::for_message(prefix, message_id));
        let document = serde_json::json!({
            "reason": poison.0,
            "quarantined_at": rfc3339(SystemTime::now()),
            "record": record,
        });
        // Serialising a JSON value into a Vec cannot fail.
        let document = serde_json::to_vec_pretty(&document).unwrap_or_default();
        match self.results.quarantine(&key, document).await {
            Ok(()) => Outcome::Poison(poison),
            Err(err) => Outcome::Store(err),
        }
    }

    /// Keeps a message to retry invisible for `delay`. If that fails, the message still
    /// comes back, after the queue's own visibility timeout.
    async fn hold(&self, record: &SqsMessage, delay: Duration) {
        let queue = record
            .event_source_arn
            .as_deref()
            .and_then(QueueRef::from_arn);
        let (Some(queue), Some(handle)) = (queue, record.receipt_handle.as_deref()) else {
            tracing::warn!("no queue ARN or receipt handle: redelivery after the queue's timeout");
            return;
        };
        match self.visibility.hold(&queue, handle, delay).await {
            Ok(()) => tracing::info!(delay_ms = delay.as_millis() as u64, "held back for retry"),
            Err(err) => {
                tracing::warn!(error = %err, "could not hold back; redelivery after the queue's timeout")
            }
        }
    }

    /// Gives the lease up, so the next delivery need not wait for it to expire.
    async fn release(&self, task: &TaskRef, owner: &str) {
        if let Err(err) = self.tasks.release(task, owner).await {
            tracing::warn!(error = %err, "could not release the lease; it expires at the deadline");
        }
    }

    /// The hold for a record AWS pushed back on. It grows with the receives and copies while
    /// the sandbox's pressure is strained.
    fn pressed_hold(&self, receives: u32, copies: u32) -> Duration {
        let strain = self.pressure.strain();
        self.settings.backoff.pressed(receives + copies, strain)
    }

    /// How long a message to retry stays invisible before it comes back. `None`: the
    /// queue's own visibility timeout. `copies`: how many fresh copies of it were sent before.
    fn hold_for(&self, outcome: &Outcome, receives: u32, copies: u32) -> Option<Duration> {
        match outcome {
            Outcome::ScrapeTransient { retry_after, .. } => {
                Some(self.settings.backoff.delay(*retry_after, receives))
            }
            // Back when the lease ends. This is not capped by the backoff's maximum: coming
            // back earlier would only find the lease again and use up a receive.
            Outcome::Leased { until } => {
                let left = until.duration_since(SystemTime::now()).unwrap_or_default();
                Some(left + Duration::from_secs(1))
            }
            // Contention passes in moments, not in a visibility timeout.
            Outcome::Store(err) if err.is_conflict() => {
                Some(self.settings.backoff.delay(None, receives))
            }
            // AWS pushed back (throttled, failed, timed out, unreachable). The hold grows
            // with the receives and copies while the sandbox's pressure is strained, and is
            // short once it has eased. It is jittered so held records do not all return at
            // once. The copies are limited by time (PRESSED_COPIES_FOR), so they outlast a
            // table's warm-up. A refusal (access denied, a missing table) waits out the
            // queue's timeout.
            outcome if pushed_back(outcome) => Some(self.pressed_hold(receives, copies)),
            Outcome::NoTimeLeft => Some(Duration::ZERO),
            Outcome::WaitHeld { delay, .. } => Some((*delay).min(MAX_POLITE_HOLD)),
            _ => None,
        }
    }
}

/// How many times a FIFO record to retry is moved to the back of its group. This gives it
/// two more rounds of receives than its message had: enough for the tries whose receives
/// its waits used up.
const MAX_FIFO_MOVES: u32 = 2;

/// Whether a final attempt may be sent again once more. While AWS pushes back: within
/// [`PRESSED_COPIES_FOR`] of its first copy for that reason. A pushed-back record's holds
/// are as short as the sandbox's strain allows, so their count says little about the time.
/// Otherwise: while it has had fewer than [`MAX_COPIES`] copies.
fn may_copy(carried: &Carried, pressed: bool, now: u64) -> bool {
    match (pressed, carried.pressed_since) {
        (true, Some(since)) => {
            Duration::from_millis(now.saturating_sub(since)) < PRESSED_COPIES_FOR
        }
        (true, None) => true,
        (false, _) => carried.copies < MAX_COPIES,
    }
}

/// A fresh copy of `record` with `body`, due after `delay`. The producer's message group
/// and message attributes go with it (the tenant, on a fair queue). A FIFO queue has no
/// per-message delay, so there the copy is due at once, with a deduplication id taken from
/// this receive.
fn copy_of(record: &SqsMessage, body: String, delay: Duration) -> MessageCopy {
    let fifo = on_fifo(record);
    MessageCopy {
        body,
        delay: if fifo { Duration::ZERO } else { delay },
        group: record.attributes.get("MessageGroupId").cloned(),
        deduplication: fifo.then(|| copy_name(record)),
        attributes: Attribute::all_of(record),
        trace_header: trace::for_copy(record),
    }
}

/// A FIFO copy's deduplication id. It is the same for the same receive of a message, so a
/// retried send makes one copy, and different for any other receive.
fn copy_name(record: &SqsMessage) -> String {
    let message = record.message_id.as_deref().unwrap_or_default();
    let receipt = record.receipt_handle.as_deref().unwrap_or_default();
    hex::encode(Sha256::digest(
        format!("copy#{message}#{receipt}").as_bytes(),
    ))
}

impl<T: TaskStore, R: ResultStore, V: Visibility> Park<'_, T, R, V> {
    /// A task handed over to the renderer: its message, with the reason, sent to the
    /// renderer's queue, due at once. If the send fails, the record is retried (a store
    /// error) and hands the task over again.
    async fn hand_over(&self, record: &SqsMessage, message: &Message, outcome: Outcome) -> Outcome {
        let (Outcome::HandedOver { reason }, Some(queue)) = (&outcome, &self.settings.render_queue)
        else {
            return outcome;
        };
        let body = message.handed_over(reason, epoch_millis(SystemTime::now()) as u64);
        let copy = MessageCopy {
            // A FIFO render queue takes a deduplication id; a standard one refuses it.
            deduplication: queue.is_fifo().then(|| copy_name(record)),
            ..copy_of(record, body, Duration::ZERO)
        };
        match self.visibility.requeue(queue, &copy).await {
            Ok(()) => outcome,
            Err(err) => {
                tracing::warn!(error = %err, "could not hand the task over to the renderer");
                Outcome::Store(err)
            }
        }
    }
}

/// AWS pushed back (throttled, failed, timed out, unreachable).
fn pushed_back(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Store(err) if err.fault().is_some_and(StoreFault::is_push_back))
}

/// Outcomes after which the task may still be open (no terminal write by this delivery).
fn ends_without_terminal_write(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::ScrapeTransient { .. }
            | Outcome::Store(_)
            | Outcome::NoTimeLeft
            | Outcome::HandedOver { .. }
    )
}
