//! The paid proxy tier, held back while a run has a budget for it. It is used only once the
//! other tiers are blocked. Its fetch first earmarks the most bytes it may use, from this
//! sandbox's share of the run's budget (`crate::paid`). The earmark is then settled with
//! what the fetch spent. The paid fetch is a fetch of its own: it gets its own time, not
//! what the other tiers left of theirs, and does not start without the least a fetch needs.

use std::time::Duration;

use crate::paid::{PAID_BUDGET_BUSY, PaidAnswer, PaidEarmark};
use crate::ports::hosts::HostStore;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::scraper::{Ask, FetchError, Fetched, Fetcher};

use super::super::context::Ctx;
use super::{Fetch, Target};

/// The reason of a record whose paid fetch was not started, for lack of time.
const NO_TIME_FOR_PAID: &str = "no time left for the paid tier";

/// The reason of a copy that went straight to the paid tier and did not get it: the budget is
/// spent.
const BLOCKED_BEFORE: &str = "blocked on the other proxy tiers before; \
     the run's budget for the paid proxy tier is spent";

/// A fetch, with the time its last leg was given and what became of the paid tier.
#[derive(Debug)]
pub(super) struct Leg {
    pub fetched: Fetched,
    /// The time the leg that ended the fetch was given: the paid fetch's, if it ran.
    pub time: Duration,
    pub paid: PaidTurn,
}

/// What became of the paid tier in a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaidTurn {
    /// Not wanted, or it fetched.
    Done,
    /// Wanted, but not started: too little time was left before the invocation's end.
    NoTime,
    /// Wanted, but the run's budget is reserved by fetches in flight elsewhere: the record
    /// waits for it.
    Busy,
}

impl<T: HostStore + SpendStore, R: ResultStore, F: Fetcher> Fetch<'_, T, R, F> {
    /// The fetch. The paid tier is tried last, and only with an earmark on the run's budget and
    /// time for a fetch of its own. A copy that waited for the budget goes straight to it.
    pub(super) async fn fetch_paid_held_back(
        &self,
        ctx: &Ctx<'_>,
        target: Target<'_>,
        time: Duration,
    ) -> Leg {
        let (Some(run_budget), paid @ 1..) = (target.wanted.paid_budget, ctx.settings.proxy_tiers)
        else {
            let fetched = self.fetch_once(ctx, target.url, within(target, time)).await;
            return Leg::done(fetched, time);
        };
        let first = self.before_paid(ctx, target, time).await;
        if !first.wants_paid_tier {
            return Leg::done(first, time);
        }
        // The time the paid fetch gets, as any fetch does, now.
        let Some(paid_time) = ctx.fetch_time() else {
            let page = Err(FetchError::ours(NO_TIME_FOR_PAID));
            return Leg::ended(Fetched { page, ..first }, time, PaidTurn::NoTime);
        };
        let cap = ctx.settings.paid_fetch_cap;
        let (hold, first) = match self.paid_earmark(target, (run_budget, cap), first).await {
            Ok(held) => held,
            Err((ended, turn)) => return Leg::ended(ended, time, turn),
        };
        let ask = Ask {
            first_tier: paid,
            wire_most: Some(cap),
            ..within(target, paid_time)
        };
        let last = self.fetch_once(ctx, target.url, ask).await;
        let spent = last.spend.tier(paid).billed();
        self.paid
            .settle(self.tasks, hold, spent, target.delivery)
            .await;
        let spend = first.spend.plus(&last.spend);
        Leg::done(Fetched { spend, ..last }, paid_time)
    }

    /// The fetch through the tiers before the paid one. A copy that waited for the run's
    /// paid budget skips it: those tiers are known to block its page.
    async fn before_paid(&self, ctx: &Ctx<'_>, target: Target<'_>, time: Duration) -> Fetched {
        if target.paid_next {
            let page = Err(FetchError::permanent(BLOCKED_BEFORE));
            return Fetched {
                wants_paid_tier: true,
                ..Fetched::unspent(page)
            };
        }
        let withheld = Ask {
            paid_tier: false,
            ..within(target, time)
        };
        self.fetch_once(ctx, target.url, withheld).await
    }

    /// An earmark of the paid tier's most bytes on the run's budget, returned with the first
    /// fetch. Without one, returns what that first fetch ends as (the budget is spent,
    /// held by fetches in flight, or could not be read), and what became of the paid tier.
    /// What the other tiers spent stays spent either way.
    async fn paid_earmark(
        &self,
        target: Target<'_>,
        (run_budget, cap): (u64, u64),
        first: Fetched,
    ) -> Result<(PaidEarmark, Fetched), (Fetched, PaidTurn)> {
        let held = self.paid.earmark(self.tasks, target.task, run_budget, cap);
        let (reason, turn) = match held.await {
            Ok(PaidAnswer::Go(hold)) => return Ok((hold, first)),
            Ok(PaidAnswer::Spent) => return Err((first, PaidTurn::Done)),
            Ok(PaidAnswer::Busy) => (PAID_BUDGET_BUSY.to_owned(), PaidTurn::Busy),
            Err(err) => {
                let reason = format!("the paid tier's budget could not be read: {err}");
                (reason, PaidTurn::Done)
            }
        };
        let page = Err(FetchError::ours(reason));
        Err((Fetched { page, ..first }, turn))
    }
}

/// What a fetch of `target` within `time` asks for.
fn within<'a>(target: Target<'a>, time: Duration) -> Ask<'a> {
    Ask {
        if_changed: target.prior.map(|prior| &prior.validators),
        detection: &target.wanted.detection,
        render: Some(&target.wanted.render),
        ..Ask::within(time)
    }
}

impl Leg {
    /// A fetch that ended without the paid tier, or with it.
    fn done(fetched: Fetched, time: Duration) -> Self {
        Self::ended(fetched, time, PaidTurn::Done)
    }

    fn ended(fetched: Fetched, time: Duration, paid: PaidTurn) -> Self {
        Self {
            fetched,
            time,
            paid,
        }
    }
}
