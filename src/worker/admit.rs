//! Stage 3, admit: the fetch gets its host's turn (the host's limits are shared by the
//! fleet, and robots.txt applies). Then the claim makes this try the delivery's own. A URL
//! that our own rules or robots.txt refuse is admitted too, and fails without a request.

use crate::batch::Invocation;
use crate::contract::{Outcome, WaitFor};
use crate::domain::health::Sign;
use crate::domain::limits::Booker;
use crate::domain::refresh::Prior;
use crate::polite::{self, Admission, DISALLOWED, Entry, GatePorts, Later, Permit, Visit, Waited};
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::scraper::{self, FetchError, Fetcher};
use crate::trace;
use std::time::Duration;

use super::guard::{Claimed, Guarded};
use super::parents::Wanted;
use super::parse::Delivery;
use super::{Step, Worker};

/// Why a task whose tries are used up is held back instead of parked for its host.
pub const TRIES_SPENT: &str =
    "its tries are spent on failures of ours: held back, toward the dead-letter queue";

/// A delivery admitted to its host: claimed, with the host's permit to fetch (or the
/// reason it fails without a request).
#[derive(Debug)]
pub(super) struct Admitted {
    pub claim: Claimed,
    pub url: Option<String>,
    pub prior: Option<Prior>,
    pub wanted: Wanted,
    pub pass: Pass,
    /// A transient failure of this try is final, because the message's receives or the
    /// task's claims reached `MAX_ATTEMPTS`.
    pub final_attempt: bool,
    /// A hop this record followed (`Guarded::followed`).
    pub followed: bool,
}

/// Whether the fetch goes ahead.
#[derive(Debug)]
pub(super) enum Pass {
    /// With the host's permit (a task without a URL has an empty one).
    Go(Permit),
    /// Without a request: our own rules refuse the URL, robots.txt forbids it, our proxy
    /// could not fetch robots.txt, or the task waited too long for its host.
    Refused(FetchError),
}

impl Pass {
    /// The host's permit, if the fetch goes ahead.
    pub fn permit(self) -> Option<Permit> {
        match self {
            Self::Go(permit) => Some(permit),
            Self::Refused(_) => None,
        }
    }
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// Takes the host's turn, then claims the task. A booked copy already made its claim as
    /// its guard, and gives its attempt back if it does not get the turn. If the claim does
    /// not go through, the permit is given back at once.
    pub(super) async fn admit(
        &self,
        delivery: &Delivery,
        guarded: Guarded,
        invocation: &Invocation,
    ) -> Step<Admitted> {
        if let Some(url) = guarded.url.as_deref().filter(|_| trace::is_on()) {
            trace::note("host", scraper::host_of(url));
        }
        let entered = match self.fetch_time(invocation) {
            Some(time) => self.enter_host(delivery, &guarded, time, invocation).await,
            None => Err(Outcome::NoTimeLeft),
        };
        let pass = match (entered, &guarded.claim) {
            (Ok(pass), _) => pass,
            (Err(ended), Some(claim)) => return Err(self.unclaimed(delivery, claim, ended).await),
            (Err(ended), None) => return Err(ended),
        };
        let claim = match guarded.claim {
            Some(claim) => claim,
            None => match self.claim(delivery, guarded.tries, invocation).await {
                Ok(claim) => claim,
                Err(ended) => {
                    return Err(self.without_permit(pass.permit(), ended, invocation).await);
                }
            },
        };
        // Every fetch follows a claim. The task's claims count its attempts across copies
        // and waits. This message's own receives also limit it, before the dead-letter queue.
        let max_attempts = self.settings.max_attempts;
        let final_attempt =
            delivery.counted_receives >= max_attempts || claim.attempts >= max_attempts;
        Ok(Admitted {
            claim,
            url: guarded.url,
            prior: guarded.prior,
            wanted: guarded.wanted,
            pass,
            final_attempt,
            followed: guarded.followed,
        })
    }

    /// The host's turn for this delivery, or the outcome of waiting for it. The checks that
    /// need no network come first, so a URL our rules refuse touches neither the host's item
    /// nor robots.txt.
    #[tracing::instrument(
        target = "conveyor_step",
        name = "host_turn",
        skip_all,
        fields(waits = i64::from(delivery.message.carried.waits))
    )]
    async fn enter_host(
        &self,
        delivery: &Delivery,
        guarded: &Guarded,
        time: Duration,
        invocation: &Invocation,
    ) -> Step<Pass> {
        let Some(url) = guarded.url.as_deref() else {
            return Ok(Pass::Go(Permit::default()));
        };
        if let Some(refused) = self.fetcher.refuses(url) {
            return Ok(Pass::Refused(refused));
        }
        let carried = &delivery.message.carried;
        let task = delivery.task();
        let booker = Booker {
            job_id: task.job_id.clone(),
            run_id: task.run_id.clone(),
        };
        let visit = Visit {
            url,
            booked: guarded.booked,
            booked_at: carried.copied_at,
            wait_left: delivery.wait_left,
            booker: Some(&booker),
            books: !delivery.fifo,
        };
        let ports = GatePorts {
            store: &self.tasks,
            fetcher: &self.fetcher,
        };
        let job = &guarded.wanted.politeness;
        let measures = &invocation.measures;
        let entry = self.gate.enter(ports, visit, job, time, measures).await?;
        if guarded.redirected && matches!(entry, Entry::Disallowed) {
            // A redirect's target: the task's result would be that page, so say which.
            let reason = format!("{DISALLOWED}: {url}");
            return Ok(Pass::Refused(FetchError::permanent(reason)));
        }
        let waited = Waited {
            waits: carried.waits,
            wait_left: delivery.wait_left,
            spent: guarded.spent,
        };
        match polite::admission(entry, waited) {
            Admission::Go(permit) => Ok(Pass::Go(permit)),
            Admission::Refused(refused) => Ok(Pass::Refused(refused)),
            Admission::Wait(Later { delay, booked }) => Err(Outcome::PoliteHeld {
                delay,
                booked,
                waits_for: WaitFor::Host,
            }),
            Admission::HeldBack => Err(Outcome::ScrapeTransient {
                reason: TRIES_SPENT.into(),
                retry_after: None,
            }),
        }
    }

    /// Gives back the permit of a delivery that did not fetch, then returns `ended`.
    pub(super) async fn without_permit(
        &self,
        permit: Option<Permit>,
        ended: Outcome,
        invocation: &Invocation,
    ) -> Outcome {
        self.return_permit(permit, None, invocation).await;
        ended
    }

    /// Gives the host's permit back, with what the fetch said of the host's health.
    pub(super) async fn return_permit(
        &self,
        permit: Option<Permit>,
        sign: Option<Sign>,
        invocation: &Invocation,
    ) {
        if let Some(permit) = permit {
            let measures = &invocation.measures;
            self.gate.leave(&self.tasks, permit, sign, measures).await;
        }
    }
}
