//! The ack contract: every way a delivery can end, and whether SQS may delete the message.

use std::time::Duration;

use crate::domain::message::Poison;
use crate::ports::error::StoreError;

/// What SQS is told about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Delete the message. The task reached its end state, or retrying would never get it there.
    Ack,
    /// Redeliver it after the visibility timeout. It is listed in `batchItemFailures`.
    Retry,
}

/// Why work on a task is not wanted, or no longer wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotWanted {
    TaskMissing,
    JobMissing,
    RunMissing,
    JobNotActive,
    RunNotRunning,
}

/// How one delivery ended. Expected situations are values here, not errors.
#[derive(Debug)]
pub enum Outcome {
    /// Claimed, scraped, stored and marked successful. `adopted` is true when another delivery
    /// stored the object first and this one wrote the task to describe that object.
    Succeeded { redelivery: bool, adopted: bool },
    /// The page can never be fetched (4xx, bad URL, too big, too many redirects). Task failed.
    FailedPermanently { reason: String },
    /// A transient failure on the last allowed attempt. Task failed with that reason.
    GaveUp { reason: String },
    /// The guard found the task already succeeded or failed. No work was done.
    AlreadyTerminal,
    /// Another delivery made the terminal write first.
    LostRace,
    /// The message body can never name a task.
    Poison(Poison),
    /// The task, its job or its run is gone, or no longer wants work.
    NotWanted(NotWanted),
    /// The fetch failed in a way worth another try (408, 425, 429, 5xx, timeout, reset). The
    /// message is held back until the retry is due, from `Retry-After` or backoff.
    ScrapeTransient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// DynamoDB or S3 failed, or held data we cannot read.
    Store(StoreError),
    /// With `DUPLICATE_POLICY=lease`, another invocation holds the task's lease until `until`.
    /// This delivery does not scrape. The message is retried after that time.
    Leased { until: std::time::SystemTime },
    /// An earlier record in its FIFO message group will be retried. This one was not
    /// processed and waits its turn.
    GroupHeld,
    /// Processing panicked. The panic was contained to this record.
    Panicked,
    /// The invocation ran out of time before this record finished.
    OutOfTime,
    /// The task's host had no room, or its robots.txt is not known yet. Room means the host's
    /// rate, slots and cooldown, which the whole fleet shares. The task was not claimed or
    /// fetched. A fresh copy of the message was sent with a delay of `delay`, so the wait does
    /// not use up a receive toward the dead-letter queue. This delivery is done.
    WaitCopied { delay: Duration },
    /// As [`Outcome::WaitCopied`], but the message is held back through its visibility
    /// timeout instead. This happens on a FIFO queue, where a copy would break the order, or
    /// when the copy could not be sent. `booked` is the start time the host's schedule booked
    /// for it, carried by the copy. `waits_for`: its host, or its run's paid budget.
    WaitHeld {
        delay: Duration,
        booked: Option<u64>,
        waits_for: WaitFor,
    },
    /// A final attempt ended for a reason on our side (no time left, a store error). It was
    /// sent again as a fresh copy, delayed by `delay`, that carries the receive count so far.
    /// The task still gets its last try. This delivery is done.
    SentAgain { delay: Duration },
    /// The page needs a browser (the job's `render: always`, or `auto` and the page is an
    /// application shell): the task was sent on to the renderer's queue, with `reason`, and
    /// its claim given back. The renderer finishes it.
    HandedOver { reason: String },
    /// Too little time was left before the cutoff to fetch the page and still store it. The
    /// page was not fetched, or the fetch stopped at its deadline. The message is made visible
    /// again at once, for an invocation with time to spare.
    NoTimeLeft,
}

/// What a record parked by a wait waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// Its host's turn (rate, slots, cooldown) or its host's robots.txt.
    Host,
    /// Its run's paid budget, held by fetches elsewhere. Its copy goes straight to the paid
    /// tier.
    PaidBudget,
}

impl Outcome {
    /// The ack contract, one row per outcome.
    pub fn reply(&self) -> Reply {
        match self {
            Outcome::Succeeded { .. } => Reply::Ack,
            Outcome::FailedPermanently { .. } => Reply::Ack,
            Outcome::GaveUp { .. } => Reply::Ack,
            Outcome::AlreadyTerminal => Reply::Ack,
            Outcome::LostRace => Reply::Ack,
            Outcome::Poison(_) => Reply::Ack,
            Outcome::NotWanted(_) => Reply::Ack,
            Outcome::WaitCopied { .. } => Reply::Ack,
            Outcome::SentAgain { .. } => Reply::Ack,
            Outcome::HandedOver { .. } => Reply::Ack,
            Outcome::WaitHeld { .. } => Reply::Retry,
            Outcome::ScrapeTransient { .. } => Reply::Retry,
            Outcome::Store(_) => Reply::Retry,
            Outcome::Leased { .. } => Reply::Retry,
            Outcome::GroupHeld => Reply::Retry,
            Outcome::Panicked => Reply::Retry,
            Outcome::OutOfTime => Reply::Retry,
            Outcome::NoTimeLeft => Reply::Retry,
        }
    }

    /// A short, stable name for logs and metrics. Dashboards and alarms read these, so they
    /// keep their names when a variant is renamed (`polite_requeued`, `polite_held` and
    /// `lease_held` are older than the glossary's words).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Succeeded { adopted: true, .. } => "succeeded_adopted",
            Outcome::Succeeded { .. } => "succeeded",
            Outcome::FailedPermanently { .. } => "failed_permanently",
            Outcome::GaveUp { .. } => "gave_up",
            Outcome::AlreadyTerminal => "already_terminal",
            Outcome::LostRace => "lost_race",
            Outcome::Poison(_) => "poison",
            Outcome::NotWanted(_) => "not_wanted",
            Outcome::WaitCopied { .. } => "polite_requeued",
            Outcome::SentAgain { .. } => "sent_again",
            Outcome::HandedOver { .. } => "handed_over",
            Outcome::WaitHeld { .. } => "polite_held",
            Outcome::ScrapeTransient { .. } => "scrape_transient",
            Outcome::Store(_) => "store_error",
            Outcome::Leased { .. } => "lease_held",
            Outcome::GroupHeld => "group_held",
            Outcome::Panicked => "panicked",
            Outcome::OutOfTime => "out_of_time",
            Outcome::NoTimeLeft => "no_time_left",
        }
    }
}

impl From<StoreError> for Outcome {
    fn from(err: StoreError) -> Self {
        Outcome::Store(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_outcomes_are_retried() {
        let corrupt = || StoreError::Corrupt {
            what: "task",
            detail: "status 7".into(),
        };
        let retried = [
            Outcome::ScrapeTransient {
                reason: "HTTP 503".into(),
                retry_after: None,
            },
            Outcome::Store(corrupt()),
            Outcome::GroupHeld,
            Outcome::Leased {
                until: std::time::SystemTime::now(),
            },
            Outcome::Panicked,
            Outcome::OutOfTime,
            Outcome::NoTimeLeft,
        ];
        let acked = [
            Outcome::Succeeded {
                redelivery: false,
                adopted: false,
            },
            Outcome::Succeeded {
                redelivery: true,
                adopted: true,
            },
            Outcome::FailedPermanently {
                reason: "HTTP 404".into(),
            },
            Outcome::GaveUp {
                reason: "HTTP 503".into(),
            },
            Outcome::AlreadyTerminal,
            Outcome::LostRace,
            Outcome::Poison(Poison("not JSON".into())),
            Outcome::NotWanted(NotWanted::RunNotRunning),
            Outcome::SentAgain {
                delay: Duration::ZERO,
            },
            Outcome::HandedOver {
                reason: "mount node".into(),
            },
        ];
        for outcome in retried {
            assert_eq!(outcome.reply(), Reply::Retry, "{outcome:?}");
        }
        for outcome in acked {
            assert_eq!(outcome.reply(), Reply::Ack, "{outcome:?}");
        }
    }
}
