//! The scenario behind the chaos test and `make run`: a run of many tasks over a local site
//! with fine, flaky, gone, slow and dead pages, messages sent more than once, through the
//! local event source mapping until the queue drains; then every invariant is checked and
//! the figures reported.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use conveyor_worker::Worker;
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::config::DuplicatePolicy;
use conveyor_worker::esm::{self, EsmSettings, EsmStats};
use conveyor_worker::visibility::Backoff;

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
}

/// Runs the scenario, checks every invariant (panicking on the first broken one) and
/// reports the figures.
pub async fn run(scenario: Scenario) -> Report {
    let Scenario {
        tasks: total,
        policy,
        faults,
        crash_rate,
    } = scenario;
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, total as u32).await;
    let mut tasks = Vec::new();
    for i in 0..total {
        let (id, kind) = (format!("t{i:04}"), KINDS[i % KINDS.len()]);
        let path = format!("/{kind}/{id}");
        stack.put_task(&id, &site.url(&path), "pending").await;
        tasks.push((id, path));
    }

    // Every task once, every fifth twice more, every twentieth three times more, shuffled.
    let mut bodies = Vec::new();
    for (i, (id, _)) in tasks.iter().enumerate() {
        let copies = 1 + 2 * usize::from(i % 5 == 0) + usize::from(i % 20 == 0);
        bodies.extend(std::iter::repeat_n(body(id), copies));
    }
    fastrand::shuffle(&mut bodies);
    let dlq = Queue::create(&stack, 30).await;
    // As deployed, the visibility timeout outlasts the invocation timeout below (in
    // production by six times; here by less, to keep crash recovery quick).
    let queue = Queue::create_with_dlq(&stack, 12, &dlq, MAX_ATTEMPTS).await;
    let mut sent = Vec::new();
    for chunk in bodies.chunks(10) {
        sent.extend(queue.send_batch(&stack, chunk).await);
    }

    let base = stack.worker_with(|t| {
        t.duplicate_policy = policy;
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
    };
    let settings = EsmSettings {
        queue_url: queue.url.clone(),
        queue_arn: queue.arn.clone(),
        pollers: 4,
        batch_size: 10,
        wait_seconds: 0,
        timeout: Duration::from_secs(10),
        limits: BatchLimits {
            max_concurrency: 16,
            deadline_margin: Duration::from_millis(500),
        },
    };

    let started = Instant::now();
    let done = AtomicBool::new(false);
    let stats = EsmStats::default();
    let watch = async {
        let mut empty_checks = 0;
        let mut last_report = Instant::now();
        while started.elapsed() < LIMIT {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let depth = queue.depth(&stack).await;
            empty_checks = if depth == 0 { empty_checks + 1 } else { 0 };
            if last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                let elapsed = started.elapsed().as_secs();
                println!(
                    "  {policy:?} at {elapsed} s: {depth} queued; {}",
                    stats.summary()
                );
            }
            if empty_checks >= 3 {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
    };
    let is_done = || done.load(Ordering::Relaxed);
    tokio::join!(
        esm::run(&stack.sqs, &worker, &settings, &stats, &is_done),
        watch
    );
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        seconds < LIMIT.as_secs_f64(),
        "{policy:?}: the queue never drained"
    );
    assert_eq!(
        queue.depth(&stack).await,
        0,
        "{policy:?}: nothing left behind"
    );

    // Where every message went: deleted after an ack, or in the dead-letter queue.
    let dead: Vec<_> = dlq.drain(&stack).await;
    let dead_ids: HashSet<String> = dead.iter().filter_map(|m| m.message_id.clone()).collect();
    let dead_tasks: HashSet<String> = dead
        .iter()
        .filter_map(|m| serde_json::from_str::<serde_json::Value>(m.body.as_deref()?).ok())
        .filter_map(|b| b["task_id"].as_str().map(str::to_owned))
        .collect();
    let acked = stats.acked.lock().expect("no poller panicked").clone();
    let lost: Vec<_> = sent
        .iter()
        .filter(|id| !acked.contains(*id) && !dead_ids.contains(*id))
        .collect();
    assert!(lost.is_empty(), "{policy:?}: messages lost: {lost:?}");

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

    // The run's counters are the task states, and it completed exactly once if it could.
    let run = stack.run_item(JOB, RUN).await;
    let unfinished = (total - successful - failed) as u64;
    assert_eq!(
        run.n("tasks_succeeded"),
        Some(successful as u64),
        "{policy:?}"
    );
    assert_eq!(run.n("tasks_failed"), Some(failed as u64), "{policy:?}");
    assert_eq!(run.n("tasks_remaining"), Some(unfinished), "{policy:?}");
    if unfinished == 0 {
        assert_eq!(run.status(), Some("completed"), "{policy:?}");
        assert_eq!(run.n("times_completed"), Some(1), "{policy:?}");
    } else {
        assert_eq!(run.status(), Some("running"), "{policy:?}");
        assert_eq!(run.n("times_completed"), None, "{policy:?}");
    }

    let fetches = tasks.iter().map(|(_, path)| site.hits(path)).sum();
    Report {
        policy,
        total,
        sent: sent.len(),
        successful,
        failed,
        dead_lettered: dead.len(),
        fetches,
        seconds,
        esm: stats.summary(),
    }
}

impl Report {
    pub fn line(&self) -> String {
        format!(
            "{:?}: {} tasks, {} messages sent, {} successful, {} failed, {} dead-lettered, \
             {:.2} fetches per task, {:.1} s; {}",
            self.policy,
            self.total,
            self.sent,
            self.successful,
            self.failed,
            self.dead_lettered,
            self.fetches as f64 / self.total as f64,
            self.seconds,
            self.esm,
        )
    }
}
