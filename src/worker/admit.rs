//! Stage 3, admit: the request gets its host's turn (the host's limits are shared by the
//! fleet, and robots.txt applies). A URL that our own rules or robots.txt refuse is
//! admitted too, and fails without a request.

use crate::contract::{Outcome, WaitFor};
use crate::domain::limits::Booker;
use crate::domain::refresh::Prior;
use crate::polite::{
    self, Admission, DISALLOWED, Entry, Gate, GatePorts, Later, Permit, Visit, Waited,
};
use crate::ports::hosts::HostStore;
use crate::scraper::{self, FetchError, Fetcher};
use crate::trace;
use std::time::Duration;

use super::claim::Claimed;
use super::context::{Ctx, Stage};
use super::guard::Guarded;
use super::parents::Wanted;

/// Why a task whose tries are used up is held back instead of parked for its host.
pub const TRIES_SPENT: &str =
    "its tries are spent on failures of ours: held back, toward the dead-letter queue";

/// A request admitted to its host and claimed: the host's permit to fetch (or the reason it
/// fails without a request), and what the fetch is of.
#[derive(Debug)]
pub(super) struct Admitted {
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

impl Admitted {
    /// The request once its task is claimed: every fetch follows a claim.
    pub fn new(ctx: &Ctx<'_>, guarded: Guarded, claim: &Claimed, pass: Pass) -> Self {
        Self {
            final_attempt: ctx.final_attempt(claim.attempts),
            url: guarded.url,
            prior: guarded.prior,
            wanted: guarded.wanted,
            pass,
            followed: guarded.followed,
        }
    }
}

/// What the host's turn reads: the host's item and schedule, and the fetcher's own rules
/// and robots.txt.
pub(super) struct Admit<'a, T, F> {
    pub tasks: &'a T,
    pub fetcher: &'a F,
    pub gate: &'a Gate,
}

impl<T: HostStore, F: Fetcher> Admit<'_, T, F> {
    /// The host's turn for this request, or the outcome of waiting for it.
    pub async fn host_turn(&self, ctx: &Ctx<'_>, guarded: &Guarded) -> Stage<Pass> {
        if let Some(url) = guarded.url.as_deref().filter(|_| trace::is_on()) {
            trace::note("host", scraper::host_of(url));
        }
        match ctx.fetch_time() {
            Some(time) => self.enter(ctx, guarded, time).await,
            None => Err(Outcome::NoTimeLeft),
        }
    }

    /// The host's turn, within `time`. The checks that need no network come first, so a URL
    /// our rules refuse touches neither the host's item nor robots.txt.
    #[tracing::instrument(
        target = "conveyor_step",
        name = "host_turn",
        skip_all,
        fields(waits = i64::from(ctx.delivery.message.carried.waits))
    )]
    async fn enter(&self, ctx: &Ctx<'_>, guarded: &Guarded, time: Duration) -> Stage<Pass> {
        let Some(url) = guarded.url.as_deref() else {
            return Ok(Pass::Go(Permit::default()));
        };
        if let Some(refused) = self.fetcher.refuses(url) {
            return Ok(Pass::Refused(refused));
        }
        let (delivery, carried) = (ctx.delivery, &ctx.delivery.message.carried);
        let task = ctx.task();
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
            store: self.tasks,
            fetcher: self.fetcher,
        };
        let job = &guarded.wanted.politeness;
        let measures = ctx.measures();
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
            Admission::Wait(Later { delay, booked }) => Err(Outcome::WaitHeld {
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
}
