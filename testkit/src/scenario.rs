//! The scenario behind the chaos test and `make run`: a run of many tasks over a local site
//! with fine, flaky, gone, slow and dead pages, messages sent more than once, through the
//! local event source mapping until the queue drains (in process, with faults, or by the
//! `conveyor-ops poll` binary); then every invariant is checked and the figures reported.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use conveyor_ops::local_mapping::{self, Ended, MappingSettings, MappingStats, Progress, Watch};
use conveyor_worker::Worker;
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::batch::ProcessRecord;
use conveyor_worker::domain::ids::TaskRef;
use conveyor_worker::domain::message;
pub use conveyor_worker::domain::render::Render;
use conveyor_worker::ports::queue::QueueRef;
use conveyor_worker::pushback::backoff::Backoff;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::{SqsQueue, SqsVisibility};
use conveyor_worker::wiring::config::DuplicatePolicy;

use super::chaos::{Crashing, Faults};
use super::fresh_site::FreshSite;
use super::polite_site::{Behaviour, PoliteSite};
use super::queue::Queue;
use super::{Earlier, JOB, MAX_ATTEMPTS, PREFIX, RUN, Site, Stack, WorkerTuning, task_ref};

/// The longest a scenario may take before it counts as stuck.
const LIMIT: Duration = Duration::from_secs(600);

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub tasks: usize,
    pub policy: DuplicatePolicy,
    /// AWS faults on the worker's clients, if any.
    pub faults: Option<Faults>,
    /// Share of S3 writes after which the record "crashes".
    pub crash_rate: f64,
    /// The worker meets AWS through the production-like layer (`scripts/prodlike.py`):
    /// transaction conflicts, stale reads, S3's limits and 409s.
    pub production_like: bool,
    /// The run's counter shards and groups (data contract v2); no shards: the run item
    /// counts (v1).
    pub counters: (u32, u32),
    /// The worker's politeness at its production defaults, the run spread over local hosts
    /// ([`Hosts`]); off: one site, no limits (the run measures the rest).
    pub polite: bool,
    /// With counter shards, the run's tasks and results spread over them too (data
    /// contract v3).
    pub spread: bool,
    /// A polite run's job's own rate for its hosts and in-flight limit, if any (default:
    /// [`POLITE_JOB_RPS`] and the fleet's in-flight limit).
    pub job_limits: Option<(f64, Option<u32>)>,
    /// Every message sent with a `MessageGroupId`, one of this many tenants (a fair queue);
    /// 0: none.
    pub tenants: usize,
    /// A FIFO queue (and dead-letter queue): each message in its tenant's group, or, without
    /// tenants, in its task's own.
    pub fifo: bool,
    /// A refresh run: every other fine page is a refresh task on a site that answers
    /// "changed since?" ([`FreshSite`]), its earlier result stored; a third of those pages
    /// changed since.
    pub refresh: bool,
    /// The shares of the page kinds ([`Mix`]); none: one task in ten of each, as [`KINDS`].
    pub mix: Option<Mix>,
    /// The seed that orders the messages sent; none: a random order.
    pub seed: Option<u64>,
    /// Proxy tiers a fetch may climb (a block on one is tried on the next): the most
    /// requests one attempt makes of a page.
    pub tiers: usize,
    /// What the job says of rendering. Unless `never`, the worker hands pages over to a
    /// render queue of its own, which a renderer drains.
    pub render: Render,
}

/// `worker`, its process "dying" right after a share `rate` of its S3 writes.
fn crashing<F>(
    worker: Worker<DynamoTaskStore, S3ResultStore, F, SqsVisibility>,
    rate: f64,
) -> Worker<DynamoTaskStore, Crashing<S3ResultStore>, F, SqsVisibility> {
    let results = Crashing {
        inner: worker.results,
        crash_rate: rate,
    };
    Worker {
        tasks: worker.tasks,
        results,
        fetcher: worker.fetcher,
        visibility: worker.visibility,
        settings: worker.settings,
        parents: worker.parents,
        gate: worker.gate,
        paid: worker.paid,
        pressure: worker.pressure,
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            tasks: 30,
            policy: DuplicatePolicy::Converge,
            faults: None,
            crash_rate: 0.0,
            production_like: false,
            counters: (0, 0),
            polite: false,
            spread: false,
            job_limits: None,
            tenants: 0,
            fifo: false,
            refresh: false,
            mix: None,
            seed: None,
            tiers: 0,
            render: Render::Never,
        }
    }
}

/// Shares of the page kinds, in the order of [`Mix::KINDS`]: fine, flaky (503 twice), gone
/// (404), slow (300 ms), dead (503 for good), blocked (403 to the first proxy tier's address)
/// and logged (fine, on a [`PoliteSite`] that logs when each request started and ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix(pub [u8; 7]);

impl Mix {
    pub const KINDS: [&str; 7] = [
        "page", "flaky", "gone", "slowpage", "down", "blocked", "logged",
    ];

    /// The kind of task `i`: the kinds in turn, each as often as its share.
    fn kind(&self, i: usize) -> &'static str {
        let total: usize = self.0.iter().map(|&w| usize::from(w)).sum();
        let mut at = i % total.max(1);
        for (kind, &weight) in Self::KINDS.iter().zip(&self.0) {
            if at < usize::from(weight) {
                return kind;
            }
            at -= usize::from(weight);
        }
        "page"
    }
}

/// The address the first proxy tier's connections come from: a site blocks it on the
/// blocked pages (`/blocks/{address}/...`).
pub const DATACENTER: [u8; 4] = [127, 0, 0, 3];

/// Every page kind, one task in ten each: mostly fine, some flaky (503 twice, then fine),
/// gone (404), slow (300 ms) or down for good (503: fails on the last attempt).
const KINDS: [&str; 10] = [
    "page", "page", "page", "page", "page", "page", "flaky", "gone", "slowpage", "down",
];

#[derive(Debug)]
pub struct Report {
    pub policy: DuplicatePolicy,
    pub total: usize,
    pub sent: usize,
    pub successful: usize,
    pub failed: usize,
    pub dead_lettered: usize,
    pub fetches: usize,
    /// The most fetches of one page against the most its messages' attempts allow.
    pub most_fetches: (usize, usize),
    /// The tasks whose messages ended in the dead-letter queue.
    pub dead_tasks: Vec<String>,
    /// Every task's status, by task id.
    pub statuses: HashMap<String, Option<String>>,
    pub seconds: f64,
    pub esm: String,
    /// The run item's status and counters, as stored.
    pub counters: String,
    /// The pages of the tasks whose messages ended in the dead-letter queue.
    pub dead_pages: Vec<String>,
    /// What the production-like layer did to this run's table and bucket, if it was on:
    /// conflicts met (transactions cancelled, writes refused, racing PUTs answered 409).
    pub conflicts: Option<u64>,
    /// The successful tasks whose stored page was rendered.
    pub rendered: usize,
}

/// The local sites a run's pages are on: one, or, for a polite run, many hosts (a site on a
/// port of its own is a host of its own for the fleet's limits), so that a run of
/// hundreds of pages at a host's default rate (1 a second) stays quick: the pages that
/// answer 503 (flaky, down) each on a host of their own, whose push-backs then slow only
/// them, the others over [`SHARED_HOSTS`] hosts.
pub struct Hosts {
    pub sites: Vec<Site>,
    /// How many of `sites` the pages that do not answer 503 share.
    shared: usize,
    /// The kind of each task's page.
    kinds: Vec<&'static str>,
    /// The site of the logged pages, if any.
    pub logged: Option<PoliteSite>,
    /// The site of the refresh tasks' pages, if any.
    pub fresh: Option<FreshSite>,
}

/// The rate a polite run's job asks of each of its hosts.
pub const POLITE_JOB_RPS: f64 = 20.0;

/// The hosts the pages that do not answer 503 share in a polite run: 10 or so pages each.
pub const SHARED_HOSTS: usize = 24;

/// Where a task's page is: one of [`Hosts::sites`], the logged site or the fresh site.
const LOGGED: usize = usize::MAX;
const FRESH: usize = usize::MAX - 1;

/// The bytes of a refresh task's page.
const REFRESH_BYTES: usize = 2_000;

impl Hosts {
    /// The sites for `total` tasks of the default kinds (one if not `polite`).
    pub async fn start(total: usize, polite: bool) -> Self {
        Self::start_for((0..total).map(kind).collect(), polite).await
    }

    /// The sites for tasks of these kinds (one, and the logged site if any, if not
    /// `polite`).
    pub async fn start_for(kinds: Vec<&'static str>, polite: bool) -> Self {
        let pushing_back = kinds.iter().filter(|k| answers_503(k)).count();
        let (shared, count) = match polite {
            true => (SHARED_HOSTS, SHARED_HOSTS + pushing_back),
            false => (1, 1),
        };
        let mut sites = Vec::with_capacity(count);
        for _ in 0..count {
            sites.push(Site::start().await);
        }
        let logged = match kinds.contains(&"logged") {
            true => Some(PoliteSite::start(Behaviour::default()).await),
            false => None,
        };
        let fresh = match kinds.contains(&"refresh") {
            true => Some(FreshSite::start().await),
            false => None,
        };
        Self {
            sites,
            shared,
            kinds,
            logged,
            fresh,
        }
    }

    /// The site of task `i` of the run.
    fn of(&self, i: usize) -> usize {
        match self.kinds[i] {
            "logged" => return LOGGED,
            "refresh" => return FRESH,
            _ => {}
        }
        if self.sites.len() == 1 {
            return 0;
        }
        if answers_503(self.kinds[i]) {
            let before = self.kinds[..i].iter().filter(|k| answers_503(k)).count();
            return self.shared + before;
        }
        i % self.shared
    }

    /// The page of task `i`, named `id`: its path and its site.
    fn page(&self, i: usize, id: &str) -> (String, usize) {
        let path = match self.kinds[i] {
            "blocked" => {
                let egress = std::net::IpAddr::from(DATACENTER);
                format!("/blocks/{egress}/{id}")
            }
            "logged" => format!("/page/{id}"),
            "refresh" => format!("/fresh/{id}?bytes={REFRESH_BYTES}"),
            kind => format!("/{kind}/{id}"),
        };
        (path, self.of(i))
    }

    fn url(&self, host: usize, path: &str) -> String {
        match (host, &self.logged, &self.fresh) {
            (LOGGED, Some(logged), _) => logged.url(path),
            (FRESH, _, Some(fresh)) => fresh.url(path),
            _ => self.sites[host].url(path),
        }
    }

    /// How often `path` was asked of `host`.
    fn hits(&self, host: usize, path: &str) -> usize {
        match (host, &self.logged, &self.fresh) {
            (LOGGED, Some(logged), _) => logged.visits().iter().filter(|v| v.path == path).count(),
            (FRESH, _, Some(fresh)) => fresh.hits(fresh_name(path)),
            _ => self.sites[host].hits(path),
        }
    }

    /// Every request any of the sites saw (robots.txt too).
    pub fn requests(&self) -> usize {
        let logged = self.logged.as_ref().map_or(0, |l| l.visits().len());
        let fresh = self.fresh.as_ref().map_or(0, |f| {
            let (full, not_modified) = f.answers();
            full + not_modified
        });
        self.sites.iter().map(|s| s.peers().len()).sum::<usize>() + logged + fresh
    }
}

/// The page name in a fresh site's path (`/fresh/{name}?bytes=...`).
fn fresh_name(path: &str) -> &str {
    let name = path.trim_start_matches("/fresh/");
    name.split('?').next().unwrap_or(name)
}

/// The page kind of task `i`.
fn kind(i: usize) -> &'static str {
    KINDS[i % KINDS.len()]
}

fn answers_503(kind: &str) -> bool {
    matches!(kind, "flaky" | "down")
}

/// A seeded run and its queue, ready to be drained.
pub struct Prepared {
    pub stack: Stack,
    /// The first of `hosts`' sites.
    pub site: Site,
    pub hosts: Hosts,
    pub queue: Queue,
    pub dlq: Queue,
    /// The renderer's queue, when the job may render: it redrives to `dlq` too.
    pub render_queue: Option<Queue>,
    render: Render,
    policy: DuplicatePolicy,
    /// Task ids and their page paths, and the site (of `hosts`) each is on.
    tasks: Vec<(String, String)>,
    placed: Vec<usize>,
    /// Message ids sent.
    sent: Vec<String>,
    /// Messages sent for each task (as `tasks`), by the producer.
    copies: Vec<usize>,
    /// The message group each task's messages were sent in (as `tasks`), if any.
    groups: Vec<Option<String>>,
    /// Tasks an operator sent a message for in a group of its own (a re-queue): their dead
    /// letters may be in another group than the producer's.
    pub regrouped: HashSet<String>,
    /// Messages an operator sent again (re-queued or redriven), by task id.
    pub resent: HashMap<String, usize>,
    /// Times an operator's re-queue reopened the completed run.
    pub reopened: u64,
    /// The most requests one attempt makes of a page (proxy tiers climbed).
    tiers: usize,
    /// AWS faults are injected on the worker's SQS calls too: a copy that could not be
    /// sent leaves its message to the redrive policy, its task perhaps ended meanwhile.
    faulty: bool,
}
/// The visibility timeout of the scenario's queue. As deployed, it outlasts the invocation
/// timeout (in production by six times; here by less, to keep crash recovery quick).
pub const VISIBILITY: Duration = Duration::from_secs(12);
/// The invocation timeout each batch gets.
pub const INVOCATION_TIMEOUT: Duration = Duration::from_secs(10);

/// The politeness a deployed function has: every default of `Config`, nothing switched off.
pub fn production_politeness() -> conveyor_worker::polite::Politeness {
    let required =
        |name: &str| matches!(name, "TABLE_NAME" | "RESULTS_BUCKET").then(|| "required".to_owned());
    conveyor_worker::wiring::config::Config::from_lookup(required)
        .expect("the defaults")
        .politeness
}

/// The worker's settings for this stack, as the function and `conveyor-ops` read them from
/// the environment: the production defaults but for what the local stack needs (a site on
/// loopback, quicker retries). Politeness is on at its defaults.
pub fn worker_env(stack: &Stack) -> [(&'static str, String); 7] {
    [
        ("TABLE_NAME", stack.table.clone()),
        ("RESULTS_BUCKET", stack.bucket.clone()),
        // The local site is on loopback.
        ("ALLOW_PRIVATE_NETWORKS", "true".into()),
        ("MAX_ATTEMPTS", MAX_ATTEMPTS.to_string()),
        ("SCRAPE_TIMEOUT_MS", "5000".into()),
        // Flaky pages come back within seconds rather than minutes.
        ("RETRY_BACKOFF_BASE_MS", "200".into()),
        ("RETRY_BACKOFF_MAX_MS", "2000".into()),
    ]
}

/// [`worker_env`] without host limits or robots.txt, for the runs of one local site that
/// measure the operator's tool, proxies and progress (a host's default rate would make
/// them minutes long); politeness at its defaults is measured by `make run`, the chaos
/// scenario and tests/it/polite_defaults.rs.
pub fn unlimited_env(stack: &Stack) -> Vec<(&'static str, String)> {
    let mut env = worker_env(stack).to_vec();
    env.extend([
        ("HOST_MAX_RPS", "0".into()),
        ("HOST_MAX_INFLIGHT", "0".into()),
        ("OBEY_ROBOTS", "false".into()),
    ]);
    env
}

/// The environment `conveyor-ops` runs with against `stack`: [`unlimited_env`], signed as
/// the operator ([`crate::OPS_KEY`]), so the emulator checks each call against the policy
/// the runbook gives its users (docs/conveyor-ops-policy.json).
pub fn ops_env(stack: &Stack) -> Vec<(&'static str, String)> {
    let mut env = unlimited_env(stack);
    env.push(("AWS_ACCESS_KEY_ID", crate::OPS_KEY.into()));
    env
}

/// Runs the scenario in process, checks every invariant (panicking on the first broken one)
/// and reports the figures.
pub async fn run(scenario: Scenario) -> Report {
    let stack = if scenario.production_like {
        Stack::prodlike().await
    } else {
        Stack::new().await
    };
    let prepared = prepare_on(stack, scenario).await;
    let (stats, seconds) = prepared.drain(scenario).await;
    let acked = stats.acked.lock().expect("no poller panicked").clone();
    let mut report = prepared
        .check(Some(&acked), seconds, &stats.summary())
        .await;
    if scenario.production_like {
        let mut conflicts = 0;
        for kind in ["transaction_conflicts", "write_conflicts", "put_conflicts"] {
            conflicts += prepared.stack.layer_count(kind).await;
        }
        report.conflicts = Some(conflicts);
    }
    report
}

/// A list of `total` URLs over the site's page kinds, written to `list` for
/// `conveyor-ops submit` (the job, run, tasks and messages are its to make), and a queue
/// with a dead-letter queue for it.
pub async fn prepare_list(
    total: usize,
    list: &std::path::Path,
    polite: bool,
) -> std::io::Result<Prepared> {
    let (stack, hosts) = (Stack::new().await, Hosts::start(total, polite).await);
    let (mut tasks, mut placed) = (Vec::new(), Vec::new());
    let mut urls = String::new();
    for i in 0..total {
        // `conveyor-ops submit` names each task by its line.
        let id = format!("t{:06}", i + 1);
        let (path, host) = hosts.page(i, &id);
        urls.push_str(&hosts.url(host, &path));
        urls.push('\n');
        tasks.push((id, path));
        placed.push(host);
    }
    std::fs::write(list, urls)?;
    let (queue, dlq) = queues(&stack, false).await;
    Ok(Prepared {
        stack,
        site: hosts.sites[0].clone(),
        hosts,
        queue,
        dlq,
        render_queue: None,
        render: Render::Never,
        policy: DuplicatePolicy::Converge,
        copies: vec![1; tasks.len()],
        groups: vec![None; tasks.len()],
        regrouped: HashSet::new(),
        tasks,
        placed,
        sent: Vec::new(),
        resent: HashMap::new(),
        reopened: 0,
        tiers: 1,
        faulty: false,
    })
}

/// The scenario's queue, redriving to its dead-letter queue after the worker's attempts;
/// both FIFO if `fifo`.
async fn queues(stack: &Stack, fifo: bool) -> (Queue, Queue) {
    let dlq = match fifo {
        true => Queue::create_fifo(stack, 30, None).await,
        false => Queue::create(stack, 30).await,
    };
    (redriving_to(stack, &dlq, fifo).await, dlq)
}

/// A queue of the worker's (or the renderer's) that redrives to `dlq` after its attempts.
async fn redriving_to(stack: &Stack, dlq: &Queue, fifo: bool) -> Queue {
    let visibility = VISIBILITY.as_secs() as u32;
    match fifo {
        true => Queue::create_fifo(stack, visibility, Some((dlq, MAX_ATTEMPTS))).await,
        false => Queue::create_with_dlq(stack, visibility, dlq, MAX_ATTEMPTS).await,
    }
}

/// Seeds a job, a counted run of `total` tasks over the site's page kinds, and a queue with
/// a dead-letter queue; sends every task once, every fifth twice more, every twentieth
/// three times more, shuffled.
pub async fn prepare(total: usize, policy: DuplicatePolicy) -> Prepared {
    let scenario = Scenario {
        tasks: total,
        policy,
        ..Scenario::default()
    };
    prepare_on(Stack::new().await, scenario).await
}

/// [`prepare`] on a given stack, for `scenario`: its tasks and their page kinds, duplicate
/// policy, job limits, counters (shards, groups; no shards: on the run item; spread: v3),
/// hosts and message groups.
pub async fn prepare_on(stack: Stack, scenario: Scenario) -> Prepared {
    let total = scenario.tasks;
    let kinds = (0..total)
        .map(|i| scenario.mix.map_or_else(|| kind(i), |mix| mix.kind(i)))
        .enumerate()
        .map(|(i, kind)| match kind {
            "page" if scenario.refresh && i.is_multiple_of(2) => "refresh",
            kind => kind,
        })
        .collect();
    let hosts = Hosts::start_for(kinds, scenario.polite).await;
    let ids: Vec<String> = (0..total).map(|i| format!("t{i:04}")).collect();
    let refs = seed_run(&stack, &scenario, &ids).await;
    let (mut tasks, mut placed) = (Vec::new(), Vec::new());
    for (i, (id, task)) in ids.into_iter().zip(&refs).enumerate() {
        let (path, host) = hosts.page(i, &id);
        let url = hosts.url(host, &path);
        match &hosts.fresh {
            Some(fresh) if host == FRESH => put_refresh(&stack, fresh, (task, &id), &url, i).await,
            _ => stack.put_task_of(task, &url, "pending").await,
        }
        tasks.push((id, path));
        placed.push(host);
    }
    let (queue, dlq) = queues(&stack, scenario.fifo).await;
    let render_queue = match scenario.render {
        Render::Never => None,
        _ => Some(redriving_to(&stack, &dlq, scenario.fifo).await),
    };
    let groups: Vec<_> = (0..total).map(|i| group_of(&scenario, i)).collect();
    let (sent, copies) = send_all(&stack, &queue, &scenario, &refs, &groups).await;
    Prepared {
        stack,
        site: hosts.sites[0].clone(),
        hosts,
        queue,
        dlq,
        render_queue,
        render: scenario.render,
        policy: scenario.policy,
        tasks,
        placed,
        sent,
        copies,
        groups,
        regrouped: HashSet::new(),
        resent: HashMap::new(),
        reopened: 0,
        tiers: scenario.tiers.max(1),
        faulty: scenario.faults.is_some(),
    }
}

/// Refresh task `i` (`task`, named `id`) of a page of `fresh`: its earlier result, the page as
/// it is now, stored under an earlier run's key; every third page changed since.
async fn put_refresh(
    stack: &Stack,
    fresh: &FreshSite,
    (task, id): (&TaskRef, &str),
    url: &str,
    i: usize,
) {
    let key = format!("{PREFIX}{JOB}/earlier/{id}");
    let (body, etag) = fresh.page(id, REFRESH_BYTES);
    stack.put_earlier(&key, &body, true).await;
    let earlier = Earlier {
        key: &key,
        body: &body,
        etag: &etag,
    };
    stack.put_refresh_task_of(task, url, earlier).await;
    if i.is_multiple_of(3) {
        fresh.change(id);
    }
}

/// The job (with its own limits if polite) and the run, counted as the scenario says; the
/// tasks as their messages name them.
async fn seed_run(stack: &Stack, scenario: &Scenario, ids: &[String]) -> Vec<TaskRef> {
    match (scenario.polite, scenario.job_limits) {
        (true, Some((rps, inflight))) => stack.put_limited_job(JOB, rps, inflight).await,
        // The job's own rate (data contract v2) keeps the run quick: at a host's default 1
        // a second, the dead pages' push-backs (up to 64 slowed intervals each) last minutes.
        (true, None) => stack.put_polite_job(JOB, POLITE_JOB_RPS).await,
        (false, _) => stack.put_job(JOB, "active").await,
    }
    // `never` is left unsaid, as jobs before rendering were.
    if scenario.render != Render::Never {
        stack.set_job_render(JOB, scenario.render.as_str()).await;
    }
    let spread = match (scenario.counters, scenario.spread) {
        ((0, _), _) => {
            stack.put_counted_run(JOB, RUN, ids.len() as u32).await;
            None
        }
        (counters, false) => {
            stack.put_sharded_run((JOB, RUN), ids, counters).await;
            None
        }
        (counters, true) => {
            stack.put_spread_run((JOB, RUN), ids, counters).await;
            Some(counters.0)
        }
    };
    ids.iter()
        .map(|id| task_ref(id).spread_over(spread))
        .collect()
}

/// The message group of task `i`'s messages: its tenant's (a fair or FIFO queue), or its
/// own on a FIFO queue without tenants.
fn group_of(scenario: &Scenario, i: usize) -> Option<String> {
    match (scenario.tenants, scenario.fifo) {
        (0, false) => None,
        (0, true) => Some(format!("task-{i}")),
        (n, _) => Some(format!("tenant-{}", i % n)),
    }
}

/// Sends every task once, every fifth twice more, every twentieth three times more,
/// shuffled (by the scenario's seed, if any), each in its group (`groups`); the message ids
/// and the messages sent per task.
async fn send_all(
    stack: &Stack,
    queue: &Queue,
    scenario: &Scenario,
    tasks: &[TaskRef],
    groups: &[Option<String>],
) -> (Vec<String>, Vec<usize>) {
    let mut bodies = Vec::new();
    let mut copies = Vec::new();
    for (i, (task, group)) in tasks.iter().zip(groups).enumerate() {
        let n = 1 + 2 * usize::from(i % 5 == 0) + usize::from(i % 20 == 0);
        bodies.extend(std::iter::repeat_n((message::body(task), group.clone()), n));
        copies.push(n);
    }
    let mut rng = scenario
        .seed
        .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
    rng.shuffle(&mut bodies);
    let mut sent = Vec::new();
    for chunk in bodies.chunks(10) {
        sent.extend(queue.send_grouped(stack, chunk).await);
    }
    (sent, copies)
}

impl Prepared {
    /// Drains the queue through the local event source mapping in process, with the
    /// scenario's faults and crashes; returns what the mapping did and how long it took.
    pub async fn drain(&self, scenario: Scenario) -> (MappingStats, f64) {
        self.drain_tuned(scenario, &|_| {}).await
    }

    /// [`Prepared::drain`] with the worker tuned further by `tune` (its proxies, say). When
    /// the job may render, the renderer then drains the render queue, tuned the same way.
    pub async fn drain_tuned(
        &self,
        scenario: Scenario,
        tune: &(dyn Fn(&mut WorkerTuning) + Sync),
    ) -> (MappingStats, f64) {
        let render_queue = self.render_queue.as_ref();
        let handing_over = render_queue.and_then(|queue| QueueRef::from_arn(&queue.arn));
        let tuned = |t: &mut WorkerTuning| {
            self.tune(scenario, t);
            t.render_queue = handing_over.clone();
            tune(t);
        };
        let worker = crashing(self.stack.worker_with(tuned), scenario.crash_rate);
        let stats = MappingStats::default();
        let mut seconds = self.drain_queue(&self.queue, &worker, &stats).await;
        if let Some(queue) = render_queue {
            let tuned = |t: &mut WorkerTuning| {
                self.tune(scenario, t);
                tune(t);
            };
            let renderer = crashing(self.stack.renderer_with(tuned), scenario.crash_rate);
            seconds += self.drain_queue(queue, &renderer, &stats).await;
        }
        (stats, seconds)
    }

    /// The scenario's tuning of a worker (or a renderer): its politeness, duplicate policy,
    /// scrape timeout, hold-backs and AWS faults.
    fn tune(&self, scenario: Scenario, t: &mut WorkerTuning) {
        if scenario.polite {
            t.politeness = production_politeness();
        }
        t.duplicate_policy = self.policy;
        t.scrape_timeout = Duration::from_secs(5);
        t.backoff = Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(2),
            jitter: fastrand::f64,
        };
        t.faults = scenario.faults;
    }

    /// Drains `queue` into `worker` through the local event source mapping, counting into
    /// `stats`; how long it took, in seconds.
    async fn drain_queue<P: ProcessRecord>(
        &self,
        queue: &Queue,
        worker: &P,
        stats: &MappingStats,
    ) -> f64 {
        let (stack, policy) = (&self.stack, self.policy);
        let settings = MappingSettings {
            queue_arn: queue.arn.clone(),
            pollers: 4,
            batch_size: 10,
            wait_seconds: 0,
            timeout: INVOCATION_TIMEOUT,
            limits: BatchLimits {
                max_concurrency: 16,
                deadline_margin: Duration::from_millis(500),
            },
        };
        let report = |p: &Progress<'_>| {
            println!(
                "  {policy:?} at {} s: {} queued; {}",
                p.elapsed.as_secs(),
                p.depth.map_or("?".into(), |d| d.to_string()),
                p.stats.summary()
            );
        };
        let watch = Watch {
            check_every: Duration::from_millis(500),
            report_every: Duration::from_secs(10),
            until_drained: true,
            limit: Some(LIMIT),
            give_up_after: conveyor_ops::local_mapping::GIVE_UP_AFTER,
            report: &report,
        };
        let started = Instant::now();
        let sqs = SqsQueue::new(stack.sqs.clone(), &queue.url);
        let never = std::future::pending();
        let ended = local_mapping::run_watched(&sqs, worker, &settings, stats, &watch, never).await;
        assert_eq!(ended, Ended::Drained, "{policy:?}: the queue never drained");
        started.elapsed().as_secs_f64()
    }

    /// Checks every invariant once the queue has drained, panicking on the first broken
    /// one, and reports the figures. `acked` (the message ids the mapping deleted after an
    /// ack), when known, proves no message vanished: each was acked or is dead-lettered.
    pub async fn check(&self, acked: Option<&HashSet<String>>, seconds: f64, esm: &str) -> Report {
        let Self {
            stack,
            queue,
            dlq,
            policy,
            tasks,
            sent,
            ..
        } = self;
        let total = tasks.len();
        for queue in std::iter::once(queue).chain(&self.render_queue) {
            let depth = queue.depth(stack).await;
            assert_eq!(depth, 0, "{policy:?}: nothing left behind");
        }
        let denied = stack.denied().await;
        assert!(denied.is_empty(), "{policy:?}: the role refused {denied:?}");

        // Where every message went: deleted after an ack, or in the dead-letter queue.
        let dead: Vec<_> = dlq.take_all(stack).await;
        let dead_ids: HashSet<String> = dead.iter().filter_map(|m| m.message_id.clone()).collect();
        let dead_tasks: HashSet<String> = dead
            .iter()
            .filter_map(|m| serde_json::from_str::<serde_json::Value>(m.body.as_deref()?).ok())
            .filter_map(|b| b["task_id"].as_str().map(str::to_owned))
            .collect();
        if let Some(acked) = acked {
            let lost: Vec<_> = sent
                .iter()
                .filter(|id| !acked.contains(*id) && !dead_ids.contains(*id))
                .collect();
            assert!(lost.is_empty(), "{policy:?}: messages lost: {lost:?}");
        }

        // Every task ended exactly once, or its message waits in the dead-letter queue.
        let stored = stack.tasks_in_run(JOB, RUN).await;
        assert_eq!(stored.len(), total);
        let (mut successful, mut failed, mut rendered) = (0, 0, 0);
        for (id, task) in &stored {
            match task.status() {
                Some("successful") => {
                    successful += 1;
                    let key = task.s("result_key").expect("a successful task has a key");
                    let object = stack.object(key).await.expect("its object is stored");
                    assert_eq!(
                        task.s("result_sha256"),
                        Some(object.sha256().as_str()),
                        "{id}"
                    );
                    rendered += usize::from(self.rendered_as_asked(id, task, &object));
                }
                Some("failed") => failed += 1,
                other => assert!(
                    dead_tasks.contains(id),
                    "{policy:?}: {id} is {other:?}, not in the DLQ"
                ),
            }
        }

        // The run's counters (its own, or its shards' added up) are the task states, and it
        // completed exactly once if it could.
        let run = stack.run_item(JOB, RUN).await;
        let unfinished = (total - successful - failed) as u64;
        let counted = stack.run_counters(JOB, RUN).await;
        let states = (successful as u64, failed as u64, unfinished);
        assert_eq!(
            counted, states,
            "{policy:?}: (succeeded, failed, remaining)"
        );
        let faults = stack.counter_tree_faults(JOB, RUN).await;
        assert!(faults.is_empty(), "{policy:?}: {faults:?}");
        // Once, and once more for each re-queue that reopened it.
        let completions = (1 + self.reopened, self.reopened);
        if unfinished == 0 {
            assert_eq!(run.status(), Some("completed"), "{policy:?}");
            assert_eq!(run.n("times_completed"), Some(completions.0), "{policy:?}");
        } else {
            assert_eq!(run.status(), Some("running"), "{policy:?}");
            let times = run.n("times_completed").unwrap_or(0);
            assert_eq!(times, completions.1, "{policy:?}: times completed");
        }

        let (fetches, most_fetches) = self.fetches_within_attempts(&stored);
        self.dead_letters_are_open_or_duplicates(&stored, &dead_tasks);
        self.dead_letters_keep_their_groups(&dead);
        let shards = match (run.n("counter_shards"), run.n("counter_groups")) {
            (Some(n), Some(g)) => format!(" (in {n} counter shards, {g} groups)"),
            (Some(n), None) => format!(" (in {n} counter shards)"),
            _ => String::new(),
        };
        let counters = format!(
            "run {}{shards}: {} succeeded, {} failed, {} remaining, completed {} time(s)",
            run.status().unwrap_or("?"),
            counted.0,
            counted.1,
            counted.2,
            run.n("times_completed").unwrap_or(0),
        );
        let dead_pages = tasks
            .iter()
            .filter(|(id, _)| dead_tasks.contains(id))
            .map(|(_, path)| path.clone())
            .collect();
        Report {
            counters,
            dead_pages,
            conflicts: None,
            policy: *policy,
            total,
            sent: sent.len(),
            successful,
            failed,
            dead_lettered: dead.len(),
            dead_tasks: dead_tasks.into_iter().collect(),
            statuses: stored
                .iter()
                .map(|(id, task)| (id.clone(), task.status().map(str::to_owned)))
                .collect(),
            fetches,
            most_fetches,
            seconds,
            esm: esm.to_owned(),
            rendered,
        }
    }

    /// Whether task `id`'s stored page was rendered, checked against the job's `render`:
    /// every page under `always` (no shell stored), none otherwise, since the run's pages
    /// are no application shells (`auto` finds none by mistake). The task and its object
    /// agree.
    fn rendered_as_asked(
        &self,
        id: &str,
        task: &super::TaskItem,
        object: &super::StoredObject,
    ) -> bool {
        let rendered = object.metadata.contains_key("rendered");
        let said = task
            .0
            .get("rendered")
            .and_then(|v| v.as_bool().ok())
            .copied();
        assert_eq!(
            said.unwrap_or(false),
            rendered,
            "{id}: the task and its object disagree"
        );
        match self.render {
            Render::Always => assert!(rendered, "{id}: stored unrendered under render: always"),
            Render::Never | Render::Auto => {
                assert!(!rendered, "{id}: rendered, needing no browser")
            }
        }
        rendered
    }
}

impl Prepared {
    /// Every task with its page's kind and its status in `statuses`.
    pub fn outcomes<'a>(
        &'a self,
        statuses: &HashMap<String, Option<String>>,
    ) -> Vec<(&'a str, &'static str, Option<String>)> {
        let status = |id: &String| statuses.get(id).cloned().flatten();
        self.tasks
            .iter()
            .zip(&self.hosts.kinds)
            .map(|((id, _), kind)| (id.as_str(), *kind, status(id)))
            .collect()
    }

    /// The fetches of every page, checked against the most its messages allow: each message
    /// sent for the task (by the producer or an operator) at most [`MAX_ATTEMPTS`] tries,
    /// each try at most one request a proxy tier (a block is tried on the next tier). The
    /// worker's own copies (parked, held back) carry their tries. Every fetch follows a
    /// claim, so the task's claims bound it too: two deliveries of one message at the same
    /// moment (its visibility lapsed under load) each claim and fetch. All fetches, and the
    /// most of one page with its bound.
    fn fetches_within_attempts(
        &self,
        stored: &[(String, super::TaskItem)],
    ) -> (usize, (usize, usize)) {
        let (mut all, mut most) = (0, (0, 1));
        for (((id, path), &host), copies) in self.tasks.iter().zip(&self.placed).zip(&self.copies) {
            let hits = self.hosts.hits(host, path);
            let sends = copies + self.resent.get(id).copied().unwrap_or(0);
            let claims = stored
                .iter()
                .find(|(t, _)| t == id)
                .and_then(|(_, t)| t.n("attempts"));
            let tries = (sends * MAX_ATTEMPTS as usize).max(claims.unwrap_or(0) as usize);
            let bound = tries * self.tiers;
            assert!(
                hits <= bound,
                "{id}: {path} fetched {hits} times, more than {sends} message(s) allow ({bound})"
            );
            all += hits;
            if hits * most.1 > most.0 * bound {
                most = (hits, bound);
            }
        }
        (all, most)
    }

    /// A task whose message is in the dead-letter queue was tried (it has a claim), with or
    /// without AWS faults: the worker never lets its own waits spend a task's receives. It
    /// is open (its tries spent on failures of ours), unless more than one message was sent
    /// for it (a copy may meet the task's end and still be dead-lettered), or AWS faults hit
    /// the worker's SQS calls (a final attempt's copy not sent leaves its message to the
    /// redrive policy): then it is printed.
    fn dead_letters_are_open_or_duplicates(
        &self,
        stored: &[(String, super::TaskItem)],
        dead: &HashSet<String>,
    ) {
        for (i, (id, _)) in self.tasks.iter().enumerate() {
            let sends = self.copies[i] + self.resent.get(id).copied().unwrap_or(0);
            let item = stored.iter().find(|(t, _)| t == id).map(|(_, t)| t);
            let status = item.and_then(|t| t.status());
            let terminal = matches!(status, Some("successful" | "failed"));
            let tried = item.and_then(|t| t.n("attempts")).unwrap_or(0) > 0;
            assert!(
                tried || !dead.contains(id),
                "{id} is {status:?} and dead-lettered untried (no claim)"
            );
            if dead.contains(id) && terminal && sends == 1 && self.faulty {
                println!(
                    "{id} is {status:?} and its one message is in the dead-letter queue (a copy's send failed?)"
                );
                continue;
            }
            assert!(
                !(dead.contains(id) && terminal && sends == 1),
                "{id} is {status:?} and its one message is in the dead-letter queue"
            );
        }
    }
}

impl Prepared {
    /// Every dead letter is in the message group its task's messages were sent in (the
    /// worker's copies and a redrive keep it), unless an operator re-queued its task.
    fn dead_letters_keep_their_groups(&self, dead: &[aws_lambda_events::event::sqs::SqsMessage]) {
        for letter in dead {
            let task = letter
                .body
                .as_deref()
                .and_then(|b| message::parse_body(Some(b)).ok());
            let Some(task) = task.map(|t| t.task_id.to_string()) else {
                continue;
            };
            let Some(i) = self.tasks.iter().position(|(id, _)| *id == task) else {
                continue;
            };
            if self.regrouped.contains(&task) {
                continue;
            }
            let group = letter.attributes.get("MessageGroupId");
            assert_eq!(
                group,
                self.groups[i].as_ref(),
                "{task}'s dead letter's group"
            );
        }
    }
}

impl Report {
    pub fn line(&self) -> String {
        let esm = if self.esm.is_empty() {
            String::new()
        } else {
            format!("; {}", self.esm)
        };
        let conflicts = match self.conflicts {
            Some(n) => format!(", {n} conflicts met"),
            None => String::new(),
        };
        let dead = match self.dead_pages.as_slice() {
            [] => String::new(),
            pages => format!(" ({})", pages.join(", ")),
        };
        // Unknown (0) when `conveyor-ops submit` sent them.
        let sent = match self.sent {
            0 => String::new(),
            n => format!(", {n} messages sent"),
        };
        format!(
            "{:?}: {} tasks{sent}, {} successful, {} failed, {} dead-lettered{dead}, \
             {:.2} fetches per task{conflicts}, {:.1} s{esm}",
            self.policy,
            self.total,
            self.successful,
            self.failed,
            self.dead_lettered,
            self.fetches as f64 / self.total as f64,
            self.seconds,
        )
    }
}
