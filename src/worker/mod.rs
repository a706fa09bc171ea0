//! One record, start to end. [`Worker::process`] reads top to bottom as the record's path.
//! It (with `stages`, `request`, `admit`, `fetch`, `hop` and `converge` under it, in this
//! file) is the only caller of the stages: no stage calls another. Each stage is a function
//! or a small type of its own, over the record's context (`context`: its delivery,
//! invocation and settings) and the ports it names.
//!
//! 1. `parse`: the SQS record becomes a delivery of one task. A poison body goes to
//!    quarantine.
//! 2. `guard`: one read says whether the task still wants work (`parents` caches the
//!    job's and run's "yes").
//! 3. `admit`: the politeness gate gives the request its host's turn.
//! 4. `claim`: the delivery makes the task its attempt. A copy parked for a booked start
//!    claims right after its guard instead.
//! 5. `fetch`: a redelivery adopts the page an earlier delivery stored (`converge`'s
//!    `adopted`). Otherwise the request sleeps until the host's start and fetches
//!    (`fetch/paid`: the paid proxy tier). A redirect, or a `304` that does not confirm
//!    the validators sent, leads to another request (`hops`): admit and fetch again.
//! 6. `converge`: the page is stored, then the single terminal write is made
//!    (`converge/stores`).
//! 7. `park`: a record not finished here is sent again as a copy or held back, and its
//!    outcome goes into the batch's reply.
//!
//! A stage hands the next a value of its own type (`Delivery`, `Guarded`, `Claimed`,
//! `Admitted`, `Scraped`), or ends the record with its [`Outcome`]. The record owns its
//! claim, and gives back the claim's attempt when no fetch followed it; the fetch stage
//! owns the host's permit from the host's start to the end of the fetch.

mod admit;
mod blocked;
mod claim;
mod context;
pub mod converge;
mod fetch;
mod guard;
mod hops;
pub mod parents;
mod park;
mod parse;
mod sqs_record;

pub use context::RecordSettings;
pub use park::MAX_COPIES;

use aws_lambda_events::event::sqs::SqsMessage;

use crate::batch::{Invocation, ProcessRecord};
use crate::contract::Outcome;
use crate::domain::hops::Hops;
use crate::domain::model::TaskStatus;
use crate::domain::render::Render;
use crate::paid::PaidAllowances;
use crate::polite::{Gate, Permit};
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::pushback::pressure::Pressure;
use crate::scraper::Fetcher;
use admit::{Admit, Admitted};
use claim::Claimed;
use context::{Ctx, Stage};
use converge::Converge;
use fetch::{Fetch, PaidTurn, Scraped};
use guard::{Guard, Guarded};
use parents::ParentsCache;
use park::Park;

/// The worker's ports and settings, built once per cold start, and what a sandbox keeps
/// between invocations (the parents cache, the hosts' views and robots.txt).
#[derive(Debug)]
pub struct Worker<T, R, F, V> {
    pub tasks: T,
    pub results: R,
    pub fetcher: F,
    pub visibility: V,
    pub settings: RecordSettings,
    pub parents: ParentsCache,
    pub gate: Gate,
    /// This sandbox's shares of runs' paid-tier budgets.
    pub paid: PaidAllowances,
    /// How many records this sandbox runs at once while AWS pushes back (AIMD).
    pub pressure: Pressure,
}

impl<T, R, F, V> Worker<T, R, F, V> {
    pub fn new(tasks: T, results: R, fetcher: F, visibility: V, settings: RecordSettings) -> Self {
        Self {
            parents: ParentsCache::new(settings.parents_ttl),
            gate: Gate::new(settings.politeness.clone()),
            paid: PaidAllowances::new(settings.paid_lease),
            pressure: Pressure::default(),
            tasks,
            results,
            fetcher,
            visibility,
            settings,
        }
    }
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// Runs one record through the stages within the invocation. Never fails: every end is
    /// an outcome.
    pub async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let settings = &self.settings;
        let mut delivery = match parse::delivery(record, settings, invocation) {
            Ok(delivery) => delivery,
            Err(poison) => return self.parking().quarantine(record, poison).await,
        };
        let mut chain = delivery.message.hops.clone();
        let ctx = Ctx {
            delivery: &delivery,
            invocation,
            settings,
        };
        let outcome = match self.stages(&ctx, &mut chain).await {
            Ok(outcome) | Err(outcome) => outcome,
        };
        // A copy sent from here on goes on from where the redirects led.
        delivery.message.hops = chain;
        let handoffs = &invocation.handoffs;
        self.parking()
            .park(record, (&delivery, handoffs), outcome)
            .await
    }

    /// Stages 2 to 6: each hands the record on to the next, or ends it with its outcome.
    /// A redirect is another request; `chain` is where the redirects have led.
    async fn stages(&self, ctx: &Ctx<'_>, chain: &mut Option<Hops>) -> Stage<Outcome> {
        let guard = Guard {
            tasks: &self.tasks,
            parents: &self.parents,
            gate: &self.gate,
        };
        let guarded = guard.check(ctx).await?;
        if let Some(handed) = always_rendered(ctx, &guarded) {
            return Ok(handed);
        }
        let (guarded, claim) = match guarded.booked {
            Some(_) => {
                let claim = claim::booked(ctx, &self.tasks).await?;
                (found_by(guarded, &claim), Some(claim))
            }
            None => (guarded, None),
        };
        let guarded = hops::resumed(guarded, chain.as_ref());
        let (mut claim, mut scraped) = self.request(ctx, guarded, claim).await?;
        let most = self.settings.max_redirects;
        while let Some(next) = hops::next_hop(&mut scraped, chain.as_ref(), most) {
            let next = chain.insert(next);
            (claim, scraped) = self.hop(ctx, (claim, scraped), next).await?;
        }
        Ok(self.converge(ctx, claim, scraped).await)
    }

    /// One request: the host's turn, the claim (unless the record holds one already), then
    /// the fetch.
    async fn request(
        &self,
        ctx: &Ctx<'_>,
        guarded: Guarded,
        claim: Option<Claimed>,
    ) -> Stage<(Claimed, Scraped)> {
        let (claim, admitted) = self.admit(ctx, guarded, claim).await?;
        let scraped = self.fetch(ctx, &claim, admitted).await?;
        Ok((claim, scraped))
    }

    /// Stages 3 and 4: the host's turn, then the claim. A claim the record holds already (a
    /// booked copy's, or the one before a hop) gives its attempt back if the turn does not
    /// come; the permit is given back if the claim does not go through.
    async fn admit(
        &self,
        ctx: &Ctx<'_>,
        guarded: Guarded,
        claim: Option<Claimed>,
    ) -> Stage<(Claimed, Admitted)> {
        let admit = Admit {
            tasks: &self.tasks,
            fetcher: &self.fetcher,
            gate: &self.gate,
        };
        let pass = match admit.host_turn(ctx, &guarded).await {
            Ok(pass) => pass,
            Err(ended) => return Err(self.give_back(ctx, claim.as_ref(), None, ended).await),
        };
        let claim = match claim {
            Some(claim) => claim,
            None => match claim::take(ctx, &self.tasks, guarded.tries).await {
                Ok(claim) => claim,
                Err(ended) => return Err(self.give_back(ctx, None, pass.permit(), ended).await),
            },
        };
        let admitted = Admitted::new(ctx, guarded, &claim, pass);
        Ok((claim, admitted))
    }

    /// Stage 5: a redelivery adopts a page already stored; otherwise the request
    /// sleeps until its host's start and fetches. The claim's attempt is given back when no
    /// fetch followed it (a wait, or no time left); the fetch stage gives back the permit.
    async fn fetch(&self, ctx: &Ctx<'_>, claim: &Claimed, admitted: Admitted) -> Stage<Scraped> {
        if claim.redelivery {
            let converge = self.converging();
            let adopted = converge.adopted(ctx, &admitted.wanted, admitted.final_attempt);
            if let Some(adopted) = adopted.await {
                let permit = admitted.pass.permit();
                return Err(self.give_back(ctx, None, permit, adopted).await);
            }
        }
        let fetch = self.fetching();
        match fetch.fetch_page(ctx, admitted).await {
            Err(ended @ (Outcome::WaitHeld { .. } | Outcome::NoTimeLeft)) => {
                Err(self.give_back(ctx, Some(claim), None, ended).await)
            }
            scraped => scraped,
        }
    }

    /// The chain's next hop, a request of its own under the record's claim. What the hops
    /// before it spent is added to its own, or recorded if the record ends here (no terminal
    /// write counts it then).
    async fn hop(
        &self,
        ctx: &Ctx<'_>,
        (claim, before): (Claimed, Scraped),
        chain: &Hops,
    ) -> Stage<(Claimed, Scraped)> {
        let (spent, counting) = (before.spend, before.wanted.counting);
        let guarded = hops::follow(ctx, before, chain, claim.spent);
        match self.request(ctx, guarded, Some(claim)).await {
            Ok((claim, scraped)) => {
                let spend = spent.plus(&scraped.spend);
                Ok((claim, Scraped { spend, ..scraped }))
            }
            Err(ended) => {
                let (task, delivery) = (ctx.task(), &ctx.delivery.id);
                let converge = self.converging();
                converge
                    .record_spend(task, counting, &spent, delivery)
                    .await;
                Err(ended)
            }
        }
    }

    /// Stage 6: stores the page, or records a final failure. A wait for the run's paid budget,
    /// or a paid leg with no time to start, was not a try of the task: the claim's attempt is
    /// given back.
    async fn converge(&self, ctx: &Ctx<'_>, claim: Claimed, scraped: Scraped) -> Outcome {
        let paid = scraped.paid;
        let converge = self.converging();
        let outcome = converge
            .store_and_finish(ctx, claim.redelivery, scraped)
            .await;
        let unfetched = paid == PaidTurn::NoTime && matches!(outcome, Outcome::NoTimeLeft);
        // A shell handed over to the renderer: the renderer's claim is the task's attempt.
        let handed = matches!(outcome, Outcome::HandedOver { .. });
        match matches!(outcome, Outcome::WaitHeld { .. }) || unfetched || handed {
            true => self.give_back(ctx, Some(&claim), None, outcome).await,
            false => outcome,
        }
    }

    /// Gives back what a request took and did not use, then returns `ended`: the claim's
    /// attempt, when no fetch followed it, and the host's permit.
    async fn give_back(
        &self,
        ctx: &Ctx<'_>,
        claim: Option<&Claimed>,
        permit: Option<Permit>,
        ended: Outcome,
    ) -> Outcome {
        if let Some(claim) = claim {
            self.unclaim(ctx, claim).await;
        }
        self.fetching().leave(ctx, permit, None).await;
        ended
    }

    /// Gives back the attempt of a claim that no fetch followed. It also restores the status
    /// the claim found, so the next delivery is not mistaken for a redelivery. A failure is
    /// only logged: the task then counts one more attempt than it was fetched.
    async fn unclaim(&self, ctx: &Ctx<'_>, claim: &Claimed) {
        let was = match claim.redelivery {
            true => TaskStatus::Processing,
            false => TaskStatus::Pending,
        };
        let owner = claim.owner.as_deref();
        if let Err(err) = self.tasks.unclaim(ctx.task(), was, owner).await {
            tracing::warn!(error = %err, "could not give the claim's attempt back");
        }
    }

    fn fetching(&self) -> Fetch<'_, T, R, F> {
        Fetch {
            tasks: &self.tasks,
            results: &self.results,
            fetcher: &self.fetcher,
            schedule: &self.gate.schedule,
            paid: &self.paid,
        }
    }

    fn converging(&self) -> Converge<'_, T, R> {
        Converge {
            tasks: &self.tasks,
            results: &self.results,
        }
    }

    fn parking(&self) -> Park<'_, T, R, V> {
        Park {
            tasks: &self.tasks,
            results: &self.results,
            visibility: &self.visibility,
            settings: &self.settings,
            pressure: &self.pressure,
        }
    }
}

/// A booked copy's request, with what its claim found: the task's URL and earlier result.
fn found_by(guarded: Guarded, claim: &Claimed) -> Guarded {
    Guarded {
        url: claim.url.clone(),
        prior: claim.prior.clone(),
        spent: claim.spent,
        ..guarded
    }
}

/// A task whose job (or itself) says `render: always` goes to the renderer before any
/// request, when its queue is known and the task is not there already.
fn always_rendered(ctx: &Ctx<'_>, guarded: &Guarded) -> Option<Outcome> {
    let handed = ctx.delivery.message.render_reason().is_some();
    let queue = ctx.settings.render_queue.is_some();
    let always = guarded.wanted.render.render == Render::Always;
    (queue && always && !handed).then(|| Outcome::HandedOver {
        reason: Render::Always.as_str().to_owned(),
    })
}

/// The worker as the batch runs it: each record to its outcome, and the paid-tier bytes
/// given back after the batch.
impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility> ProcessRecord
    for Worker<T, R, F, V>
{
    /// A record waits for its turn under the sandbox's pressure limit (AWS push-back), and
    /// the limit then learns from its outcome.
    async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        let _turn = self.pressure.admit().await;
        let outcome = Worker::process(self, record, invocation).await;
        self.pressure.learn(&outcome);
        outcome
    }

    async fn out_of_time(&self, record: &SqsMessage) -> Outcome {
        self.parking().out_of_time(record).await
    }

    async fn held_in_group(&self, record: &SqsMessage) -> Outcome {
        self.parking().held_in_group(record).await
    }

    /// Gives the paid-tier bytes reserved and not spent back to their runs.
    async fn after_batch(&self) {
        self.paid.give_back(&self.tasks).await;
    }

    /// The fetcher's own measures (the renderer's browser).
    fn take_measures(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.fetcher.take_measures()
    }
}
