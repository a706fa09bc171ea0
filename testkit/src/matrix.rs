//! The matrix: a whole run's configuration drawn from a seed (politeness, proxies, a paid
//! budget, data contract, queue kind, duplicate policy, an operator's step mid-run, crashes,
//! the production-like layer, AWS faults, the job's `render`, a site mix), drained through
//! the local event source mapping (and the renderer's, for pages handed over), and checked
//! against the invariants of the system as one.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use conveyor_ops::{redrive, requeue};
use conveyor_worker::domain::proxy::{ProxySecret, Tiers};
use conveyor_worker::pushback::backoff::Backoff;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::sqs::SqsQueue;
use conveyor_worker::wiring::config::DuplicatePolicy;

use super::chaos::Faults;
use super::forward_proxy::{ForwardProxy, PASSWORD, USER};
use super::scenario::{self, DATACENTER, Mix, POLITE_JOB_RPS, Prepared, Render, Report, Scenario};
use super::{JOB, MAX_BODY_BYTES, RUN, Stack, id};

/// The paid tier's egress address.
const RESIDENTIAL: [u8; 4] = [127, 0, 0, 4];
/// Pollers of the local event source mapping: each a sandbox, as far as a paid hold goes.
const POLLERS: u64 = 4;
/// The hold-backs of a run with a paid budget. A paid fetch that finds the run's budget held
/// by another fetch is a failure of ours, tried again later, and its sandbox takes that
/// answer for up to 5 s before asking the run again; the scenario's hold-backs (200 ms
/// doubling to 2 s) spend all of a task's tries within those 5 s, production's (5 s
/// doubling) seldom do. These never do: jittered in their upper half, at least 0.5 + 1 + 2
/// + 2 s between five tries.
const PAID_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(4),
    jitter: || 0.5 + fastrand::f64() / 2.0,
};
/// How long a sandbox's paid-tier lease lasts in the matrix's paid draws: a stranded
/// reservation is taken back within the run, as it is within the deployed 30 minutes.
const PAID_LEASE: Duration = Duration::from_secs(20);
/// The in-flight limit a host has by the fleet's defaults (`HOST_MAX_INFLIGHT`).
const DEFAULT_INFLIGHT: u32 = 2;

/// The worker's politeness: at the production defaults with the job's rate at
/// [`POLITE_JOB_RPS`], or the job's own rate and in-flight limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Politeness {
    Defaults,
    JobLimits { rps: f64, inflight: u32 },
}

/// How the worker reaches the sites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    Direct,
    /// One tier, a tinyproxy.
    Tier,
    /// One tier that asks for credentials the worker does not have (407).
    Asks407,
    /// One tier whose tinyproxy is stopped mid-run.
    Dies,
    /// A free tier the blocked pages refuse, then a paid one, with a budget on the run.
    Paid,
}

/// What an operator does once the queue first drains, before it is drained again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Nothing,
    /// `conveyor-ops requeue-failed`.
    RequeueFailed,
    /// `conveyor-ops redrive --to` the task queue.
    Redrive,
}

/// The run's data contract: counted on its item (v1), in counter shards and groups (v2),
/// or spread over its shards (v3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    V1,
    V2 { shards: u32, groups: u32 },
    V3 { shards: u32, groups: u32 },
}

/// One configuration of the system, drawn from a seed.
#[derive(Debug, Clone, Copy)]
pub struct Draw {
    pub seed: u64,
    pub tasks: usize,
    pub politeness: Politeness,
    pub proxy: Proxy,
    pub contract: Contract,
    /// Tenants whose group ids the messages carry (a fair queue); 0: a standard queue.
    pub tenants: usize,
    /// A FIFO queue: the messages in their tenants' groups, or each task's own.
    pub fifo: bool,
    /// A refresh run: every other fine page a refresh task, a third of those pages changed.
    pub refresh: bool,
    pub policy: DuplicatePolicy,
    pub operator: Operator,
    pub crash_rate: f64,
    pub production_like: bool,
    pub faults: bool,
    pub mix: Mix,
    /// What the job says of rendering: unless `never`, a renderer drains the pages the
    /// worker hands over.
    pub render: Render,
}

impl Draw {
    /// The configuration seed `seed` draws.
    pub fn of(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let politeness = match rng.bool() {
            true => Politeness::Defaults,
            false => Politeness::JobLimits {
                rps: *rng.choice(&[4.0, 5.0, 8.0]).unwrap_or(&5.0),
                inflight: rng.u32(1..=3),
            },
        };
        let proxy = match rng.u8(0..10) {
            0..=2 => Proxy::Direct,
            3..=4 => Proxy::Tier,
            5 => Proxy::Asks407,
            6 => Proxy::Dies,
            _ => Proxy::Paid,
        };
        let contract = match rng.u8(0..3) {
            0 => Contract::V1,
            1 => Contract::V2 {
                shards: rng.u32(2..=8),
                groups: rng.u32(0..=3),
            },
            _ => Contract::V3 {
                shards: rng.u32(2..=8),
                groups: rng.u32(0..=2),
            },
        };
        let blocked = if proxy == Proxy::Paid {
            rng.u8(2..=3)
        } else {
            0
        };
        // Fine, flaky, gone, slow, dead, blocked, logged.
        let mix = Mix([
            rng.u8(3..=8),
            rng.u8(0..=2),
            rng.u8(0..=2),
            rng.u8(0..=1),
            rng.u8(0..=1),
            blocked,
            rng.u8(1..=2),
        ]);
        let mut draw = Self {
            seed,
            tasks: rng.usize(30..=40),
            politeness,
            proxy,
            contract,
            tenants: if rng.bool() { 3 } else { 0 },
            fifo: false,
            refresh: false,
            policy: match rng.bool() {
                true => DuplicatePolicy::Converge,
                false => DuplicatePolicy::Lease,
            },
            operator: *rng
                .choice(&[
                    Operator::Nothing,
                    Operator::RequeueFailed,
                    Operator::Redrive,
                ])
                .unwrap_or(&Operator::Nothing),
            crash_rate: if rng.u8(0..3) == 0 { 0.03 } else { 0.0 },
            production_like: rng.bool(),
            faults: rng.u8(0..3) == 0,
            mix,
            render: Render::Never,
        };
        // Drawn last, so that the seeds drawn before it keep the rest of their draws.
        draw.fifo = rng.u8(0..4) == 0;
        draw.refresh = rng.u8(0..3) == 0;
        draw.render = match rng.u8(0..3) {
            0 => Render::Never,
            1 => Render::Always,
            _ => Render::Auto,
        };
        draw
    }

    /// The scenario this draw runs.
    pub fn scenario(&self) -> Scenario {
        let (counters, spread) = match self.contract {
            Contract::V1 => ((0, 0), false),
            Contract::V2 { shards, groups } => ((shards, groups), false),
            Contract::V3 { shards, groups } => ((shards, groups), true),
        };
        Scenario {
            tasks: self.tasks,
            policy: self.policy,
            faults: self.faults.then_some(Faults {
                error_rate: 0.03,
                slow_rate: 0.10,
                delay: Duration::from_millis(30),
            }),
            crash_rate: self.crash_rate,
            production_like: self.production_like,
            counters,
            polite: true,
            spread,
            job_limits: match self.politeness {
                Politeness::Defaults => None,
                Politeness::JobLimits { rps, inflight } => Some((rps, Some(inflight))),
            },
            tenants: self.tenants,
            fifo: self.fifo,
            refresh: self.refresh,
            mix: Some(self.mix),
            seed: Some(self.seed),
            tiers: if self.proxy == Proxy::Paid { 2 } else { 1 },
            render: self.render,
        }
    }

    /// The host's rate and in-flight limit the run must keep.
    fn limits(&self) -> (f64, u32) {
        match self.politeness {
            Politeness::Defaults => (POLITE_JOB_RPS, DEFAULT_INFLIGHT),
            Politeness::JobLimits { rps, inflight } => (rps, inflight),
        }
    }

    /// No fault, crash, conflict or failing proxy: nothing may be dead-lettered.
    fn clean(&self) -> bool {
        !self.faults
            && self.crash_rate == 0.0
            && !self.production_like
            && !matches!(self.proxy, Proxy::Asks407 | Proxy::Dies)
    }
}

impl fmt::Display for Draw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let politeness = match self.politeness {
            Politeness::Defaults => format!("defaults at {POLITE_JOB_RPS} rps"),
            Politeness::JobLimits { rps, inflight } => {
                format!("job {rps} rps, {inflight} in flight")
            }
        };
        let queue = match (self.tenants, self.fifo) {
            (0, false) => "standard".to_owned(),
            (n, false) => format!("fair ({n} tenants)"),
            (0, true) => "FIFO (a group a task)".to_owned(),
            (n, true) => format!("FIFO ({n} tenants' groups)"),
        };
        let [fine, flaky, gone, slow, dead, blocked, logged] = self.mix.0;
        write!(
            f,
            "seed {}: {} tasks, politeness {politeness}, proxy {:?}, {:?}, {queue} queue, \
             {:?}, operator {:?}, crashes {}, production-like {}, faults {}, refresh {}, render \
             {:?}, mix fine {fine} flaky {flaky} gone {gone} slow {slow} dead {dead} blocked \
             {blocked} logged {logged}",
            self.seed,
            self.tasks,
            self.proxy,
            self.contract,
            self.policy,
            self.operator,
            self.crash_rate,
            self.production_like,
            self.faults,
            self.refresh,
            self.render,
        )
    }
}

/// What a drawn run came to.
pub struct Figures {
    pub report: Report,
    /// Messages an operator sent again.
    pub resent: usize,
    /// The paid tier's wire bytes and their bound, if there was a budget.
    pub paid: Option<(u64, u64)>,
    /// The most requests that started within a second at the logged host, and the most in
    /// flight there.
    pub logged: (usize, usize),
    /// The dead-lettered tasks by page kind, status and the error their task holds.
    pub dead: String,
    /// A refresh run's pages: full answers and 304s.
    pub fresh: Option<(usize, usize)>,
}

impl Figures {
    pub fn line(&self, draw: &Draw) -> String {
        let r = &self.report;
        let paid = match self.paid {
            Some((spent, bound)) => format!(", paid {spent} B of at most {bound} B"),
            None => String::new(),
        };
        let fresh = match self.fresh {
            Some((full, not_modified)) => {
                format!(", refresh pages {full} full answers and {not_modified} 304s")
            }
            None => String::new(),
        };
        format!(
            "seed {}: {} tasks, {} messages sent, {} re-sent by the operator, {} successful, \
             {} failed, {} dead-lettered ({} tasks), {} rendered, {:.2} fetches per task (most {} \
             of {} allowed), logged host {} starts a second, {} in flight{paid}{fresh}, {:.1} s{}; {}",
            draw.seed,
            r.total,
            r.sent,
            self.resent,
            r.successful,
            r.failed,
            r.dead_lettered,
            r.dead_tasks.len(),
            r.rendered,
            r.fetches as f64 / r.total as f64,
            r.most_fetches.0,
            r.most_fetches.1,
            self.logged.0,
            self.logged.1,
            r.seconds,
            self.dead,
            r.esm,
        )
    }
}

/// The password the worker is given for a proxy that asks for another (407): a secret all
/// the same, never to be printed.
pub const WRONG_PASSWORD: &str = "wrong-secret-5c1d";

/// The lines of `logs` that hold a proxy's password (as given, or in a `Basic` header).
pub fn secrets_in(logs: &str) -> Vec<String> {
    use base64::Engine;
    let basic = |password: &str| {
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"))
    };
    let secrets = [
        PASSWORD.to_owned(),
        WRONG_PASSWORD.to_owned(),
        basic(PASSWORD),
        basic(WRONG_PASSWORD),
    ];
    let leaks = |line: &&str| secrets.iter().any(|secret| line.contains(secret.as_str()));
    logs.lines().filter(leaks).map(str::to_owned).collect()
}

/// The proxies a draw runs with (each asking for credentials), and the worker's tiers
/// through them and its credentials for them.
struct Proxies {
    tiers: Tiers,
    secret: ProxySecret,
    /// Stopped mid-run when the draw says so.
    dying: Option<ForwardProxy>,
    _kept: Vec<ForwardProxy>,
}

async fn proxies(proxy: Proxy) -> Proxies {
    let datacenter = || ForwardProxy::start(IpAddr::from(DATACENTER), true);
    let (kept, dying) = match proxy {
        Proxy::Direct => (Vec::new(), None),
        Proxy::Tier | Proxy::Asks407 => (vec![datacenter().await], None),
        Proxy::Dies => (Vec::new(), Some(datacenter().await)),
        Proxy::Paid => {
            let paid = ForwardProxy::start(IpAddr::from(RESIDENTIAL), true).await;
            (vec![datacenter().await, paid], None)
        }
    };
    let urls: Vec<String> = kept.iter().chain(&dying).map(ForwardProxy::url).collect();
    let password = match proxy {
        Proxy::Asks407 => WRONG_PASSWORD,
        _ => PASSWORD,
    };
    let secret = serde_json::json!({ "username": USER, "password": password }).to_string();
    Proxies {
        tiers: Tiers::parse(&urls.join(";")).expect("the proxies' URLs"),
        secret: ProxySecret::parse(&secret).expect("a proxy secret"),
        dying,
        _kept: kept,
    }
}

/// Runs the draw: seeds the run, sends its messages, drains the queue, does the operator's
/// step and drains again, then checks every invariant (panicking on the first broken one).
pub async fn run(draw: &Draw) -> Figures {
    let scenario = draw.scenario();
    let stack = match draw.production_like {
        true => Stack::prodlike().await,
        false => Stack::new().await,
    };
    let mut proxies = proxies(draw.proxy).await;
    let mut prepared = scenario::prepare_on(stack, scenario).await;
    let cap = conveyor_worker::scraper::most_spent(MAX_BODY_BYTES);
    // About three pages' wire bytes: some blocked pages get the paid tier, the rest fail
    // for the budget.
    let budget = 800;
    if draw.proxy == Proxy::Paid {
        prepared.stack.set_paid_budget(budget).await;
    }
    if let Some(dying) = proxies.dying.take() {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            drop(dying);
        });
    }
    let (tiers, paid) = (proxies.tiers.clone(), draw.proxy == Proxy::Paid);
    let secret = proxies.secret.clone();
    let (canary, reached) = aimed(draw, &prepared).await;
    let tune = move |t: &mut super::WorkerTuning| {
        t.proxies = tiers.clone();
        t.proxy_secret = secret.clone();
        if canary.is_some() {
            // As deployed: private addresses refused, but for the sites' own.
            t.allow_private_networks = false;
            t.trusted = vec![SITES];
        }
        if paid {
            t.backoff = PAID_BACKOFF;
            // A record waits while the run's budget is held; a reservation a cut give-back
            // stranded is taken back when its lease ends (30 minutes as deployed).
            t.paid_lease = PAID_LEASE;
        }
    };
    let (first, mut seconds) = prepared.drain_tuned(scenario, &tune).await;
    let mut acked = first.acked.lock().expect("no poller panicked").clone();
    let mut esm = first.summary();
    let resent = operator_step(draw, &mut prepared, &mut acked).await;
    if draw.operator != Operator::Nothing {
        let (second, more) = prepared.drain_tuned(scenario, &tune).await;
        acked.extend(
            second
                .acked
                .lock()
                .expect("no poller panicked")
                .iter()
                .cloned(),
        );
        seconds += more;
        esm = format!("{esm}; then {}", second.summary());
    }
    let report = prepared.check(Some(&acked), seconds, &esm).await;
    let reached = reached.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reached, 0, "connections that reached the canary");
    let paid = match draw.proxy {
        Proxy::Paid => Some((paid_spend(&prepared.stack).await, budget + POLLERS * cap)),
        _ => None,
    };
    let errors = errors(&prepared.stack).await;
    let figures = Figures {
        dead: dead_reasons(&prepared, &report, &errors),
        report,
        resent,
        paid,
        logged: logged_limits(&prepared),
        fresh: prepared.hosts.fresh.as_ref().map(|f| f.answers()),
    };
    check_draw(draw, &prepared, &figures, &errors);
    figures
}

/// The sites' address: loopback, trusted as public when the draw renders.
const SITES: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// When the draw renders: a canary on another loopback address, which the sites' pages
/// aim a browser at every way a page can ([`Site::aim_pages_at`](super::Site)), and what
/// reaches it. A draw without a browser gets neither.
async fn aimed(
    draw: &Draw,
    prepared: &Prepared,
) -> (
    Option<std::net::SocketAddr>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    if draw.render == Render::Never {
        return (None, Default::default());
    }
    let (canary, reached) = super::canary::canary("127.0.0.9").await;
    for site in &prepared.hosts.sites {
        site.aim_pages_at(canary);
    }
    (Some(canary), reached)
}

/// The operator's step: every failed task re-queued, or the dead-letter queue redriven;
/// the messages it sent (those it moved count as consumed: added to `acked`).
async fn operator_step(draw: &Draw, prepared: &mut Prepared, acked: &mut HashSet<String>) -> usize {
    let stack = &prepared.stack;
    let queue = SqsQueue::new(stack.sqs.clone(), &prepared.queue.url);
    let sent: Vec<String> = match draw.operator {
        Operator::Nothing => return 0,
        Operator::RequeueFailed => {
            let completed = stack.run_item(JOB, RUN).await.status() == Some("completed");
            let tasks = DynamoTaskStore::new(stack.dynamodb.clone(), &stack.table);
            let stop = AtomicBool::new(false);
            let done = requeue::requeue_failed(
                &tasks,
                &queue,
                conveyor_worker::domain::ids::RunRef::new(&id(JOB), &id(RUN)),
                false,
                &stop,
            )
            .await
            .expect("re-queue the failed tasks");
            assert!(done.unsent.is_empty() && done.stopped.is_none(), "{done:?}");
            assert!(done.conflicted.is_empty(), "{done:?}");
            if completed && !done.reset.is_empty() {
                prepared.reopened += 1;
            }
            prepared.regrouped.extend(done.sent.iter().cloned());
            done.sent
        }
        Operator::Redrive => {
            let dead = SqsQueue::new(stack.sqs.clone(), &prepared.dlq.url);
            let done = redrive::redrive(&dead, Some(&queue), usize::MAX)
                .await
                .expect("redrive the dead-letter queue");
            acked.extend(done.seen.iter().map(|d| d.message_id.clone()));
            let task = |d: &redrive::DeadLetter| d.task.rsplit('/').next().map(str::to_owned);
            done.seen.iter().filter_map(task).collect()
        }
    };
    for task in &sent {
        *prepared.resent.entry(task.clone()).or_default() += 1;
    }
    sent.len()
}

/// The error each task's item holds, if any, by task id.
async fn errors(stack: &Stack) -> HashMap<String, String> {
    let tasks = stack.tasks_in_run(JOB, RUN).await.into_iter();
    let error = |item: &super::TaskItem| {
        let said = item.s("error").or(item.s("tries_spent")).unwrap_or("");
        said.chars().take(120).collect()
    };
    tasks.map(|(id, item)| (id, error(&item))).collect()
}

/// The paid tier's spend, as the run's budget account holds it.
async fn paid_spend(stack: &Stack) -> u64 {
    let run = stack.run_item(JOB, RUN).await;
    run.n("paid_tier_spent_bytes").unwrap_or(0)
}

/// The dead-lettered tasks counted by their page's kind, their status and the error their
/// item holds (if any): ` (dead-lettered: 2 blocked processing "...")`, or nothing.
fn dead_reasons(prepared: &Prepared, report: &Report, errors: &HashMap<String, String>) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for (task, kind, status) in prepared.outcomes(&report.statuses) {
        if report.dead_tasks.iter().any(|t| t == task) {
            let error = errors.get(task).cloned().unwrap_or_default();
            let status = status.unwrap_or_else(|| "?".into());
            *counts.entry((kind, status, error)).or_insert(0) += 1;
        }
    }
    if counts.is_empty() {
        return String::new();
    }
    let each: Vec<String> = counts
        .iter()
        .map(|((kind, status, error), n)| format!("{n} {kind} {status} {error:?}"))
        .collect();
    format!(" (dead-lettered: {})", each.join(", "))
}

/// The most requests that started within a second at the logged host, and the most in
/// flight there.
fn logged_limits(prepared: &Prepared) -> (usize, usize) {
    prepared.hosts.logged.as_ref().map_or((0, 0), |site| {
        (
            site.most_started_within(Duration::from_secs(1)),
            site.most_in_flight(),
        )
    })
}

/// The invariants that depend on the draw.
fn check_draw(
    draw: &Draw,
    prepared: &Prepared,
    figures: &Figures,
    errors: &HashMap<String, String>,
) {
    let report = &figures.report;
    let (rps, inflight) = draw.limits();
    let (starts, most_in_flight) = figures.logged;
    assert!(
        starts as f64 <= rps.floor() + 1.0,
        "{starts} starts within a second at the logged host: {rps} a second, +1"
    );
    assert!(
        most_in_flight <= inflight as usize,
        "{most_in_flight} in flight at the logged host, limit {inflight}"
    );
    let stored: Vec<&str> = errors.values().map(String::as_str).collect();
    let leaked = secrets_in(&stored.join("\n"));
    assert!(leaked.is_empty(), "a secret in a task's error: {leaked:?}");
    if let Some((spent, bound)) = figures.paid {
        assert!(spent <= bound, "paid spend {spent} B, bound {bound} B");
    }
    if draw.clean() {
        assert_eq!(
            report.dead_lettered, 0,
            "nothing dead-lettered: {:?}{}",
            report.dead_tasks, figures.dead
        );
    }
    if draw.proxy == Proxy::Asks407 {
        assert_eq!(report.successful + report.failed, 0, "every task open");
        assert_eq!(
            report.dead_tasks.len(),
            report.total,
            "every task dead-lettered"
        );
        assert_eq!(prepared.hosts.requests(), 0, "nothing reached a site");
    }
    for (task, kind, status) in prepared.outcomes(&report.statuses) {
        let may_fail = matches!(kind, "gone" | "down" | "blocked");
        let may_succeed = !matches!(kind, "gone" | "down");
        let ok = match status.as_deref() {
            Some("failed") => may_fail,
            Some("successful") => may_succeed,
            _ => true,
        };
        let error = errors.get(task).map_or("", String::as_str);
        assert!(ok, "{task}, a {kind} page, is {status:?}: {error}");
    }
}
