//! The ack contract: every way a delivery can end, and whether SQS may delete the message.

use std::time::Duration;

use crate::domain::message::Poison;
use crate::ports::error::StoreError;

/// What SQS is told about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Delete it: the task reached its end state, or never will by retrying.
    Ack,
    /// Redeliver it after the visibility timeout: listed in `batchItemFailures`.
    Retry,
}

/// Why work on a task is not wanted (any more).
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
    /// Claimed, scraped, stored and finished as successful. `adopted` when another delivery
    /// had stored the object first and this one wrote the task to describe that object.
    Succeeded { redelivery: bool, adopted: bool },
    /// The page can never be had (4xx, bad URL, too big, too many redirects): task failed.
    FailedPermanently { reason: String },
    /// A transient failure on the last allowed attempt: task failed with that reason.
    GaveUp { reason: String },
    /// The guard found the task successful or failed already: no work done.
    AlreadyTerminal,
    /// Another delivery made the terminal write first.
    LostRace,
    /// The body can never name a task.
    Poison(Poison),
    /// The task, its job or its run is gone, or no longer wants work.
    NotWanted(NotWanted),
    /// The page failed in a way worth another try (408, 425, 429, 5xx, timeout, reset); the
    /// message is held back until the retry is due (`Retry-After` or backoff).
    ScrapeTransient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// DynamoDB or S3 failed, or held data we cannot read.
    Store(StoreError),
    /// `DUPLICATE_POLICY=lease`: another invocation holds the task's lease until `until`;
    /// retried after it, without scraping.
    LeaseHeld { until: std::time::SystemTime },
    /// An earlier record of its FIFO message group is to be retried; this one was not
    /// processed and waits its turn.
    GroupHeld,
    /// Processing panicked; the panic was contained to this record.
    Panicked,
    /// The invocation ran out of time before this record finished.
    OutOfTime,
    /// The task's host had no room (its rate, slots or cooldown, shared by the fleet) or its
    /// robots.txt is not known yet: not claimed, not fetched. A fresh copy of the message was
    /// sent, due after `delay`, so the wait uses up no receive on the way to the dead-letter
    /// queue; this delivery is done.
    PoliteRequeued { delay: Duration },
    /// As [`Outcome::PoliteRequeued`], but held back through its visibility instead (a FIFO
    /// queue, whose order a copy would break, or the copy could not be sent). `booked`: the
    /// start the host's schedule booked for it, carried by the copy.
    PoliteHeld {
        delay: Duration,
        booked: Option<u64>,
    },
    /// A final attempt that ended for a reason of ours (no time left, a store error) was
    /// sent again as a fresh copy, due after `delay`, carrying the receives spent: the task
    /// still gets its last try; this delivery is done.
    SentAgain { delay: Duration },
    /// Too little time was left before the cutoff to fetch the page and still store it:
    /// not fetched (or the fetch stopped at its deadline), and made visible again at once for
    /// an invocation with time to spare.
    NoTimeLeft,
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
            Outcome::PoliteRequeued { .. } => Reply::Ack,
            Outcome::SentAgain { .. } => Reply::Ack,
            Outcome::PoliteHeld { .. } => Reply::Retry,
            Outcome::ScrapeTransient { .. } => Reply::Retry,
            Outcome::Store(_) => Reply::Retry,
            Outcome::LeaseHeld { .. } => Reply::Retry,
            Outcome::GroupHeld => Reply::Retry,
            Outcome::Panicked => Reply::Retry,
            Outcome::OutOfTime => Reply::Retry,
            Outcome::NoTimeLeft => Reply::Retry,
        }
    }

    /// A short, stable name for logs and metrics.
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
            Outcome::PoliteRequeued { .. } => "polite_requeued",
            Outcome::SentAgain { .. } => "sent_again",
            Outcome::PoliteHeld { .. } => "polite_held",
            Outcome::ScrapeTransient { .. } => "scrape_transient",
            Outcome::Store(_) => "store_error",
            Outcome::LeaseHeld { .. } => "lease_held",
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
            Outcome::LeaseHeld {
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
        ];
        for outcome in retried {
            assert_eq!(outcome.reply(), Reply::Retry, "{outcome:?}");
        }
        for outcome in acked {
            assert_eq!(outcome.reply(), Reply::Ack, "{outcome:?}");
        }
    }
}
