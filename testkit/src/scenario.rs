//! The scenario behind the chaos test and `make run`: a run of many tasks over a local site
//! with fine, flaky, gone, slow and dead pages, messages sent more than once, through the
//! local event source mapping until the queue drains (in process, with faults, or by the
//! `conveyor-ops poll` binary); then every invariant is checked and the figures reported.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use conveyor_worker::Worker;
use conveyor_worker::backoff::Backoff;
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::config::DuplicatePolicy;
use conveyor_worker::ops::local_mapping::{
    self, Ended, MappingSettings, MappingStats, Progress, Watch,
};
use conveyor_worker::store::sqs::SqsQueue;

use super::chaos::{Crashing, Faults};
use super::queue::Queue;
use super::{JOB, MAX_ATTEMPTS, RUN, Site, Stack, body};

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
}

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
    pub seconds: f64,
    pub esm: String,
    /// The run item's status and counters, as stored.
    pub counters: String,
    /// The pages of the tasks whose messages ended in the dead-letter queue.
    pub dead_pages: Vec<String>,
    /// What the production-like layer did to this run's table and bucket, if it was on:
    /// conflicts met (transactions cancelled, writes refused, racing PUTs answered 409).
    pub conflicts: Option<u64>,
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
}

/// The rate a polite run's job asks of each of its hosts.
pub const POLITE_JOB_RPS: f64 = 20.0;

/// The hosts the pages that do not answer 503 share in a polite run: 10 or so pages each.
pub const SHARED_HOSTS: usize = 24;

impl Hosts {
    /// The sites for `total` tasks (one if not `polite`).
    pub async fn start(total: usize, polite: bool) -> Self {
        let pushing_back = (0..total).filter(|&i| answers_503(kind(i))).count();
        let (shared, count) = match polite {
            true => (SHARED_HOSTS, SHARED_HOSTS + pushing_back),
            false => (1, 1),
        };
        let mut sites = Vec::with_capacity(count);
        for _ in 0..count {
            sites.push(Site::start().await);
        }
        Self { sites, shared }
    }

    /// The site of task `i` of the run.
    fn of(&self, i: usize) -> usize {
        if self.sites.len() == 1 {
            return 0;
        }
        if answers_503(kind(i)) {
            let before = (0..i).filter(|&j| answers_503(kind(j))).count();
            return self.shared + before;
        }
        i % self.shared
    }
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
    dlq: Queue,
    policy: DuplicatePolicy,
    /// Task ids and their page paths, and the site (of `hosts`) each is on.
    tasks: Vec<(String, String)>,
    placed: Vec<usize>,
    /// Message ids sent.
    sent: Vec<String>,
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
    conveyor_worker::config::Config::from_lookup(required)
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
        let (id, host) = (format!("t{:06}", i + 1), hosts.of(i));
        let path = format!("/{}/{id}", kind(i));
        urls.push_str(&hosts.sites[host].url(&path));
        urls.push('\n');
        tasks.push((id, path));
        placed.push(host);
    }
    std::fs::write(list, urls)?;
    let (queue, dlq) = queues(&stack).await;
    Ok(Prepared {
        stack,
        site: hosts.sites[0].clone(),
        hosts,
        queue,
        dlq,
        policy: DuplicatePolicy::Converge,
        tasks,
        placed,
        sent: Vec::new(),
    })
}

/// The scenario's queue, redriving to its dead-letter queue after the worker's attempts.
async fn queues(stack: &Stack) -> (Queue, Queue) {
    let dlq = Queue::create(stack, 30).await;
    let visibility = VISIBILITY.as_secs() as u32;
    let queue = Queue::create_with_dlq(stack, visibility, &dlq, MAX_ATTEMPTS).await;
    (queue, dlq)
}

/// Seeds a job, a counted run of `total` tasks over the site's page kinds, and a queue with
/// a dead-letter queue; sends every task once, every fifth twice more, every twentieth
/// three times more, shuffled.
pub async fn prepare(total: usize, policy: DuplicatePolicy) -> Prepared {
    let scenario = Scenario {
        tasks: total,
        policy,
        faults: None,
        crash_rate: 0.0,
        production_like: false,
        counters: (0, 0),
        polite: false,
    };
    prepare_on(Stack::new().await, scenario).await
}

/// [`prepare`] on a given stack, for `scenario`: its tasks, duplicate policy, counters
/// (shards, groups; no shards: on the run item) and hosts.
pub async fn prepare_on(stack: Stack, scenario: Scenario) -> Prepared {
    let (total, policy, counters) = (scenario.tasks, scenario.policy, scenario.counters);
    let hosts = Hosts::start(total, scenario.polite).await;
    let ids: Vec<String> = (0..total).map(|i| format!("t{i:04}")).collect();
    match scenario.polite {
        // The job's own rate (data contract v2) keeps the run quick: at a host's default 1
        // a second, the dead pages' push-backs (up to 64 slowed intervals each) last minutes.
        true => stack.put_polite_job(JOB, POLITE_JOB_RPS).await,
        false => stack.put_job(JOB, "active").await,
    }
    match counters {
        (0, _) => stack.put_counted_run(JOB, RUN, total as u32).await,
        counters => stack.put_sharded_run((JOB, RUN), &ids, counters).await,
    }
    let (mut tasks, mut placed) = (Vec::new(), Vec::new());
    for (i, id) in ids.into_iter().enumerate() {
        let (path, host) = (format!("/{}/{id}", kind(i)), hosts.of(i));
        stack
            .put_task(&id, &hosts.sites[host].url(&path), "pending")
            .await;
        tasks.push((id, path));
        placed.push(host);
    }

    let mut bodies = Vec::new();
    for (i, (id, _)) in tasks.iter().enumerate() {
        let copies = 1 + 2 * usize::from(i % 5 == 0) + usize::from(i % 20 == 0);
        bodies.extend(std::iter::repeat_n(body(id), copies));
    }
    fastrand::shuffle(&mut bodies);
    let (queue, dlq) = queues(&stack).await;
    let mut sent = Vec::new();
    for chunk in bodies.chunks(10) {
        sent.extend(queue.send_batch(&stack, chunk).await);
    }
    Prepared {
        stack,
        site: hosts.sites[0].clone(),
        hosts,
        queue,
        dlq,
        policy,
        tasks,
        placed,
        sent,
    }
}

impl Prepared {
    /// Drains the queue through the local event source mapping in process, with the
    /// scenario's faults and crashes; returns what the mapping did and how long it took.
    pub async fn drain(&self, scenario: Scenario) -> (MappingStats, f64) {
        let Self {
            stack,
            queue,
            policy,
            ..
        } = self;
        let Scenario {
            faults,
            crash_rate,
            polite,
            ..
        } = scenario;
        let base = stack.worker_with(|t| {
            if polite {
                t.politeness = production_politeness();
            }
            t.duplicate_policy = *policy;
            t.scrape_timeout = Duration::from_secs(5);
            t.backoff = Backoff {
                base: Duration::from_millis(200),
                max: Duration::from_secs(2),
                jitter: fastrand::f64,
            };
            t.faults = faults;
        });
        let worker = Worker {
            tasks: base.tasks,
            results: Crashing {
                inner: base.results,
                crash_rate,
            },
            fetcher: base.fetcher,
            visibility: base.visibility,
            settings: base.settings,
            parents: base.parents,
            gate: base.gate,
            paid: base.paid,
            pressure: base.pressure,
        };
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

        let stats = MappingStats::default();
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
            give_up_after: conveyor_worker::ops::local_mapping::GIVE_UP_AFTER,
            report: &report,
        };
        let started = Instant::now();
        let ended = local_mapping::run_watched(
            &SqsQueue::new(stack.sqs.clone(), &queue.url),
            &worker,
            &settings,
            &stats,
            &watch,
            std::future::pending(),
        )
        .await;
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(ended, Ended::Drained, "{policy:?}: the queue never drained");
        (stats, seconds)
    }

    /// Checks every invariant once the queue has drained, panicking on the first broken
    /// one, and reports the figures. `acked` (the message ids the mapping deleted after an
    /// ack), when known, proves no message vanished: each was acked or is dead-lettered.
    pub async fn check(&self, acked: Option<&HashSet<String>>, seconds: f64, esm: &str) -> Report {
        let Self {
            stack,
            hosts,
            queue,
            dlq,
            policy,
            tasks,
            placed,
            sent,
            ..
        } = self;
        let total = tasks.len();
        assert_eq!(
            queue.depth(stack).await,
            0,
            "{policy:?}: nothing left behind"
        );

        // Where every message went: deleted after an ack, or in the dead-letter queue.
        let dead: Vec<_> = dlq.drain(stack).await;
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
        let (mut successful, mut failed) = (0, 0);
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
        if unfinished == 0 {
            assert_eq!(run.status(), Some("completed"), "{policy:?}");
            assert_eq!(run.n("times_completed"), Some(1), "{policy:?}");
        } else {
            assert_eq!(run.status(), Some("running"), "{policy:?}");
            assert_eq!(run.n("times_completed"), None, "{policy:?}");
        }

        let fetches = tasks
            .iter()
            .zip(placed)
            .map(|((_, path), &host)| hosts.sites[host].hits(path))
            .sum();
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
            fetches,
            seconds,
            esm: esm.to_owned(),
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
