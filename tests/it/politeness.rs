//! A polite fleet end to end: several sandboxes (each a worker with its own caches, polling
//! the emulator's queue with 16 records in flight) against logged local sites, with the
//! hosts' shared state in the emulator's table.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use conveyor_ops::local_mapping::{self, Ended, MappingSettings, MappingStats, Watch};
use conveyor_testkit::forward_proxy::ForwardProxy;
use conveyor_testkit::polite_site::{self, Behaviour, PoliteSite};
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::batch::{BatchLimits, ProcessRecord};
use conveyor_worker::domain::limits::Host;
use conveyor_worker::domain::proxy::Tiers;
use conveyor_worker::polite::limits::HostLimits;
use conveyor_worker::polite::robots::ROBOTS_PAID_BUDGET;
use conveyor_worker::polite::{Politeness, RobotsPaid};
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::store::sqs::SqsQueue;

use crate::polite_defaults::production_defaults;

const SANDBOXES: usize = 3;

/// Politeness as the tests turn it on: these limits, robots.txt obeyed, fetched again after
/// a failed fetch in two seconds.
fn polite(max_rps: Option<f64>, max_inflight: Option<u32>) -> Politeness {
    Politeness {
        limits: HostLimits {
            max_rps,
            max_inflight,
        },
        obey_robots: true,
        robots_retry: Duration::from_secs(2),
        agent: "conveyor-worker".into(),
        ..Politeness::off()
    }
}

/// A run of a task per path, on each path's site, and its queue (dead-letter after the
/// worker's attempts), every task sent once.
pub(crate) async fn run_of(stack: &Stack, pages: &[(&PoliteSite, String)]) -> (Queue, Queue) {
    stack.put_job(JOB, "active").await;
    tasks_of(stack, pages).await
}

/// The run's tasks of [`run_of`], for a job already in place.
pub(crate) async fn tasks_of(stack: &Stack, pages: &[(&PoliteSite, String)]) -> (Queue, Queue) {
    let urls: Vec<String> = pages.iter().map(|(site, path)| site.url(path)).collect();
    tasks_at(stack, &urls).await
}

/// A counted run of a task per URL for the job in place, and its queue (dead-letter after
/// the worker's attempts), every task sent once. A message stays hidden longer than any
/// fleet's invocation runs, as template.yaml's six times the function's timeout keeps it in
/// production: a slow batch is not delivered again while it runs.
pub(crate) async fn tasks_at(stack: &Stack, urls: &[String]) -> (Queue, Queue) {
    stack.put_counted_run(JOB, RUN, urls.len() as u32).await;
    let mut bodies = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let id = format!("t{i:03}");
        stack.put_task(&id, url, "pending").await;
        bodies.push(body(&id));
    }
    let dlq = Queue::create(stack, 30).await;
    let queue = Queue::create_with_dlq(stack, HIDDEN_SECONDS, &dlq, MAX_ATTEMPTS).await;
    for chunk in bodies.chunks(10) {
        queue.send_batch(stack, chunk).await;
    }
    (queue, dlq)
}

/// How long a received message stays hidden: more than [`Fleet::timeout`] of every fleet
/// here (20 s at most).
const HIDDEN_SECONDS: u32 = 30;

/// How many sandboxes drain a queue, each with how many pollers, and how long each
/// invocation may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fleet {
    pub sandboxes: usize,
    pub pollers: usize,
    pub timeout: Duration,
    pub limit: Duration,
}

/// [`SANDBOXES`] sandboxes of one poller each, invocations of 8 s.
const SMALL_FLEET: Fleet = Fleet {
    sandboxes: SANDBOXES,
    pollers: 1,
    timeout: Duration::from_secs(8),
    limit: Duration::from_secs(120),
};

/// Drains the queue with [`SANDBOXES`] sandboxes at once; how long it took.
async fn drain(stack: &Stack, queue: &Queue, politeness: Politeness) -> Duration {
    drain_with(stack, queue, politeness, SMALL_FLEET).await.took
}

/// What a drain took: in all, and until the fleet had received as many messages as the
/// queue held when it began (the mapping's delay in reading its backlog), if it did.
pub(crate) struct Drained {
    pub took: Duration,
    pub backlog_read: Option<Duration>,
    /// Messages the fleet received: the tasks', their copies and their redeliveries.
    pub received: u64,
    /// The tasks whose messages the queue delivered to a poller while another held them
    /// (both may scrape), each with how many such deliveries.
    pub doubled: HashMap<String, u64>,
}

/// Asserts that each task's page was fetched (or its message dead-lettered: `what`)
/// exactly once, but a task whose message the queue handed to two pollers at once, which
/// may have been so once more for each such delivery. `counts`: every task's, by task id.
pub(crate) fn assert_once_each_but_doubled(
    what: &str,
    counts: &BTreeMap<String, usize>,
    doubled: &HashMap<String, u64>,
) {
    let wrong: Vec<String> = counts
        .iter()
        .filter_map(|(task, &times)| {
            let most = 1 + doubled.get(task).copied().unwrap_or(0) as usize;
            let fine = (1..=most).contains(&times);
            (!fine).then(|| format!("{task} {what} {times} times, at most {most}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{wrong:?}; delivered twice at once: {doubled:?}"
    );
}

/// Drains the queue with `fleet`'s sandboxes at once, each a worker with its own caches and
/// its own pollers (the local event source mapping), counted together.
pub(crate) async fn drain_with(
    stack: &Stack,
    queue: &Queue,
    politeness: Politeness,
    fleet: Fleet,
) -> Drained {
    let tune = |t: &mut WorkerTuning| t.politeness = politeness.clone();
    drain_tuned(stack, queue, &tune, fleet).await
}

/// [`drain_with`], each sandbox's worker tuned by `tune`.
pub(crate) async fn drain_tuned(
    stack: &Stack,
    queue: &Queue,
    tune: &dyn Fn(&mut WorkerTuning),
    fleet: Fleet,
) -> Drained {
    let workers: Vec<_> = (0..fleet.sandboxes)
        .map(|_| stack.worker_with(tune))
        .collect();
    drain_by(stack, queue, &workers, fleet).await
}

/// Drains the queue with `workers`, a sandbox each (the renderer's too), as `fleet` says.
pub(crate) async fn drain_by<P: ProcessRecord>(
    stack: &Stack,
    queue: &Queue,
    workers: &[P],
    fleet: Fleet,
) -> Drained {
    let backlog = queue.depth(stack).await;
    let backlog_read = std::sync::OnceLock::new();
    let settings = MappingSettings {
        queue_arn: queue.arn.clone(),
        pollers: fleet.pollers,
        batch_size: 10,
        wait_seconds: 0,
        timeout: fleet.timeout,
        limits: BatchLimits {
            max_concurrency: 16,
            deadline_margin: Duration::from_millis(500),
        },
    };
    let sqs = SqsQueue::new(stack.sqs.clone(), &queue.url);
    let stats = MappingStats::default();
    let report = |progress: &local_mapping::Progress<'_>| {
        if progress
            .stats
            .received
            .load(std::sync::atomic::Ordering::Relaxed)
            >= backlog
        {
            backlog_read.get_or_init(|| progress.elapsed);
        }
    };
    let started = Instant::now();
    let sandboxes = workers.iter().map(|worker| async {
        let watch = Watch {
            check_every: Duration::from_millis(300),
            report_every: Duration::ZERO,
            until_drained: true,
            limit: Some(fleet.limit),
            give_up_after: conveyor_ops::local_mapping::GIVE_UP_AFTER,
            report: &report,
        };
        let stop = std::future::pending();
        local_mapping::run_watched(&sqs, worker, &settings, &stats, &watch, stop).await
    });
    let ended = futures_util::future::join_all(sandboxes).await;
    assert!(ended.iter().all(|e| *e == Ended::Drained), "{ended:?}");
    let denied = stack.denied().await;
    assert!(denied.is_empty(), "the worker's role refused {denied:?}");
    Drained {
        took: started.elapsed(),
        backlog_read: backlog_read.get().copied(),
        received: stats.received.load(std::sync::atomic::Ordering::Relaxed),
        doubled: stats.doubled_tasks(),
    }
}

/// The worker's requests by operation, for the figures.
pub(crate) fn by_operation(calls: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for call in calls {
        *counts.entry(call.as_str()).or_insert(0) += 1;
    }
    format!("{counts:?}")
}

pub(crate) async fn statuses(stack: &Stack, n: usize) -> Vec<String> {
    let mut statuses = Vec::new();
    for i in 0..n {
        let task = stack.task(&format!("t{i:03}")).await;
        statuses.push(task.status().unwrap_or("missing").to_owned());
    }
    println!("statuses: {statuses:?}");
    statuses
}

pub(crate) fn pages<'a>(
    site: &'a PoliteSite,
    prefix: &str,
    n: usize,
) -> Vec<(&'a PoliteSite, String)> {
    (0..n).map(|i| (site, format!("/{prefix}/{i}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_keeps_each_hosts_rate_and_in_flight_limits_and_two_hosts_apart() {
    let stack = Stack::new().await;
    let slow = Behaviour {
        page_time: Duration::from_millis(1_500),
        ..Behaviour::default()
    };
    let (a, b) = (
        PoliteSite::start(slow).await,
        PoliteSite::start(Behaviour::default()).await,
    );
    let mut work = pages(&a, "page", 20);
    work.extend(pages(&b, "page", 20));
    let (queue, dlq) = run_of(&stack, &work).await;
    stack.calls.clear();

    let took = drain(&stack, &queue, polite(Some(5.0), Some(4))).await;

    assert!(statuses(&stack, 40).await.iter().all(|s| s == "successful"));
    assert_eq!(dlq.depth(&stack).await, 0);
    let second = Duration::from_secs(1);
    for site in [&a, &b] {
        let (most, in_flight) = (site.most_started_within(second), site.most_in_flight());
        assert!(most <= 6, "{most} starts in a second: 5 a second, +1");
        assert!(in_flight <= 4, "{in_flight} at once");
        assert_eq!(site.hits("/robots.txt"), 1, "once for the fleet");
    }
    // Each host has its own schedule: the fleet booked each host's starts on its own item
    // (a shared one would hold the two hosts to 5 a second together).
    for site in [&a, &b] {
        let host = site.url("").trim_start_matches("http://").to_owned();
        let item = stack.host_item(&host, "HOST").await;
        assert!(item.n("next_start").is_some(), "{host}: {item:?}");
    }
    let together = polite_site::most_started_within(&[&a, &b], second);
    println!("politeness: {together} starts in a second on the two hosts together");
    let calls = stack.calls.calls();
    let requests = calls.len() as f64 / 40.0;
    println!("politeness: requests by operation {}", by_operation(&calls));
    println!(
        "politeness: 40 tasks on two hosts at 5/s and 4 at once in {took:?}, {requests:.2} AWS requests a task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invocations_that_end_mid_fetch_keep_the_hosts_in_flight_limit() {
    // Arrange: pages of 1.5 s in invocations of 3 s: fetches are cut by their invocation's
    // end or their own budget (the request dropped, the site stops serving it), and their
    // records come back to fetch again.
    let stack = Stack::new().await;
    let slow = Behaviour {
        page_time: Duration::from_millis(1_500),
        ..Behaviour::default()
    };
    let site = PoliteSite::start(slow).await;
    let (queue, dlq) = run_of(&stack, &pages(&site, "page", 20)).await;
    let short = Fleet {
        timeout: Duration::from_secs(3),
        ..SMALL_FLEET
    };

    // Act
    let drained = drain_with(&stack, &queue, polite(Some(5.0), Some(4)), short).await;

    // Assert: every task done once; fetches were cut and made again, and never more than
    // the host's four at once, the cut ones counted until the site stopped serving them.
    assert!(statuses(&stack, 20).await.iter().all(|s| s == "successful"));
    let dead: Vec<_> = dlq
        .drain(&stack)
        .await
        .into_iter()
        .map(|m| m.body)
        .collect();
    let doubled = drained.doubled;
    assert!(
        dead.is_empty(),
        "dead-lettered {dead:?}; delivered twice at once: {doubled:?}"
    );
    let visits = site.visits();
    let fetched = visits
        .iter()
        .filter(|v| v.path.starts_with("/page"))
        .count();
    assert!(fetched > 20, "{fetched} page requests: none was cut");
    let in_flight = site.most_in_flight();
    assert!(in_flight <= 4, "{in_flight} at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_429_with_retry_after_holds_the_host_for_every_sandbox() {
    let stack = Stack::new().await;
    let refusing = Behaviour {
        refuse_next: (1, 3),
        ..Behaviour::default()
    };
    let site = PoliteSite::start(refusing).await;
    let (queue, dlq) = run_of(&stack, &pages(&site, "page", 30)).await;

    drain(&stack, &queue, polite(Some(20.0), Some(8))).await;

    assert!(statuses(&stack, 30).await.iter().all(|s| s == "successful"));
    assert_eq!(dlq.depth(&stack).await, 0);
    let visits = site.visits();
    let refused = visits
        .iter()
        .find(|v| v.path.starts_with("/page"))
        .expect("a page visit");
    // Fetches granted before the 429 was recorded for the fleet (one DynamoDB write after
    // the answer; each granted fetch still claims its task first) still go: on the emulator
    // of a loaded 2-core machine that takes up to a few hundred ms. None starts after, within
    // Retry-After.
    let recorded = refused.ended + Duration::from_secs(1);
    let quiet_until = refused.ended + Duration::from_secs(3);
    let during = visits
        .iter()
        .filter(|v| v.started > recorded && v.started < quiet_until)
        .count();
    assert_eq!(during, 0, "no request from any sandbox within Retry-After");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robots_txt_is_fetched_once_for_the_fleet_and_a_disallowed_path_never() {
    let stack = Stack::new().await;
    let rules = Behaviour {
        robots: (200, "User-agent: *\nDisallow: /private\n".into()),
        ..Behaviour::default()
    };
    let site = PoliteSite::start(rules).await;
    let mut work = pages(&site, "page", 20);
    work.extend(pages(&site, "private", 5));
    let (queue, dlq) = run_of(&stack, &work).await;

    drain(&stack, &queue, polite(Some(50.0), Some(8))).await;

    let statuses = statuses(&stack, 25).await;
    assert!(statuses[..20].iter().all(|s| s == "successful"));
    assert!(statuses[20..].iter().all(|s| s == "failed"));
    assert_eq!(
        stack.task("t020").await.s("error"),
        Some("disallowed by robots.txt")
    );
    assert_eq!(site.hits("/private"), 0);
    assert_eq!(site.hits("/robots.txt"), 1);
    assert_eq!(dlq.depth(&stack).await, 0);
}

/// The robots.txt requests `proxy` forwarded to `site`.
fn robots_through(proxy: &ForwardProxy, site: &PoliteSite) -> usize {
    let robots = site.url("/robots.txt");
    let forwarded = proxy.requests();
    forwarded.iter().filter(|r| r.contains(&robots)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_robots_txt_answering_429_asks_the_free_tier_first_and_the_paid_one_within_its_budget() {
    // Arrange: two sites whose robots.txt always answers 429 without Retry-After, behind a
    // free tier and a paid one; robots.txt asked again after 300 ms at first. The first
    // host has the default budget for robots.txt on the paid tier, the second none.
    let stack = Stack::new().await;
    let refusing = || Behaviour {
        robots: (429, String::new()),
        ..Behaviour::default()
    };
    let (budgeted, unbudgeted) = (
        PoliteSite::start(refusing()).await,
        PoliteSite::start(refusing()).await,
    );
    stack.put_active_run().await;
    stack
        .put_task("a", &budgeted.url("/page/a"), "pending")
        .await;
    stack
        .put_task("b", &unbudgeted.url("/page/b"), "pending")
        .await;
    let free = ForwardProxy::start([127, 0, 0, 3].into(), false).await;
    let paid = ForwardProxy::start([127, 0, 0, 4].into(), false).await;
    let tiers = Tiers::parse(&format!("{};{}", free.url(), paid.url())).expect("proxy URLs");
    let politeness = |budget| Politeness {
        robots_retry: Duration::from_millis(300),
        robots_paid: RobotsPaid { tier: 0, budget },
        ..production_defaults()
    };
    let worker = |budget: u64| {
        stack.worker_with(|t| {
            t.politeness = politeness(budget);
            t.proxies = tiers.clone();
        })
    };
    let (with_budget, without) = (worker(ROBOTS_PAID_BUDGET), worker(0));

    // Act: each task delivered every 200 ms for 4 s, as its held message would come back.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        run_batch(&with_budget, vec![delivery("a")]).await;
        run_batch(&without, vec![delivery("b")]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Assert: the paid tier only after the free one, only within a budget, and charged
    // to the host's day.
    let (a_free, a_paid) = (
        robots_through(&free, &budgeted),
        robots_through(&paid, &budgeted),
    );
    let (b_free, b_paid) = (
        robots_through(&free, &unbudgeted),
        robots_through(&paid, &unbudgeted),
    );
    println!(
        "robots.txt 429: with a budget {a_free} free and {a_paid} paid requests, without {b_free} and {b_paid}"
    );
    assert!(b_free >= 1 && b_paid == 0, "no budget, no paid request");
    assert!(
        a_paid >= 1 && a_paid <= a_free,
        "{a_paid} paid after {a_free} free"
    );
    let host = Host::of(&url::Url::parse(&budgeted.url("/")).expect("a URL")).expect("a host");
    let today = &conveyor_worker::domain::time::rfc3339(SystemTime::now())[..10];
    let store =
        conveyor_worker::store::dynamo::DynamoTaskStore::new(stack.dynamodb.clone(), &stack.table);
    let spend = conveyor_worker::store::dynamo::hosts::operator::robots_spend(&store, &host, today)
        .await
        .expect("read")
        .expect("the day's spend");
    assert_eq!(
        spend.fetches, a_paid as u64,
        "each paid request held the budget"
    );
    assert_eq!(spend.held, 0, "every hold settled");
    assert!(spend.spent <= ROBOTS_PAID_BUDGET, "{spend:?}");
}

#[tokio::test]
async fn a_robots_txt_past_the_body_cap_is_read_to_500_kib_and_obeyed() {
    // Arrange: a 600 KiB robots.txt (the tests' MAX_BODY_BYTES is 16 KiB) whose rules come
    // first, as RFC 9309 lets a parser stop at 500 KiB.
    let stack = Stack::new().await;
    let mut file = String::from("User-agent: *\nDisallow: /private\n");
    while file.len() < 600 * 1024 {
        file.push_str("# a long comment line, as some sites' files carry\n");
    }
    let site = PoliteSite::start(Behaviour {
        robots: (200, file),
        ..Behaviour::default()
    })
    .await;
    stack.put_active_run().await;
    stack
        .put_task("t000", &site.url("/page/0"), "pending")
        .await;
    stack
        .put_task("t001", &site.url("/private/1"), "pending")
        .await;
    let worker = stack.worker_with(|t| t.politeness = polite(None, None));

    // Act
    let reply = run_batch(&worker, vec![delivery("t000"), delivery("t001")]).await;

    // Assert: obeyed, not taken as "unavailable"; kept for the fleet as parsed.
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t000").await.status(), Some("successful"));
    let private = stack.task("t001").await;
    assert_eq!(private.s("error"), Some("disallowed by robots.txt"));
    assert_eq!(site.hits("/private"), 0);
    let host = site.url("").trim_start_matches("http://").to_owned();
    let kept = stack.host_item(&host, "ROBOTS").await;
    assert_eq!(kept.s("status"), Some("rules"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_robots_txt_answering_503_holds_the_hosts_tasks_then_they_proceed() {
    let stack = Stack::new().await;
    let failing = Behaviour {
        robots: (503, String::new()),
        ..Behaviour::default()
    };
    let site = PoliteSite::start(failing).await;
    let (queue, dlq) = run_of(&stack, &pages(&site, "page", 20)).await;
    let recovering = {
        let site = site.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            site.set(|b| b.robots = (200, "User-agent: *\nAllow: /\n".into()));
        }
    };

    let (_, took) = tokio::join!(
        recovering,
        drain(&stack, &queue, polite(Some(50.0), Some(8)))
    );

    assert!(statuses(&stack, 20).await.iter().all(|s| s == "successful"));
    assert_eq!(dlq.depth(&stack).await, 0);
    let visits = site.visits();
    let first_page = visits
        .iter()
        .find(|v| v.path.starts_with("/page"))
        .expect("pages");
    let robots: Vec<_> = visits.iter().filter(|v| v.path == "/robots.txt").collect();
    assert!(robots.len() >= 2, "fetched again after its retry time");
    assert!(
        first_page.started > robots[robots.len() - 1].ended,
        "no page before robots.txt answered"
    );
    println!(
        "politeness: robots.txt 503 then 200: {} robots fetches, drained in {took:?}",
        robots.len()
    );
}

/// Tasks `t{from}`..`t{to}` of the run, pending on `site`'s pages, delivered once.
async fn delivered(
    stack: &Stack,
    site: &PoliteSite,
    (from, to): (usize, usize),
) -> Vec<aws_lambda_events::event::sqs::SqsMessage> {
    let mut records = Vec::new();
    for i in from..to {
        let id = format!("t{i:03}");
        stack
            .put_task(&id, &site.url(&format!("/page/{i}")), "pending")
            .await;
        records.push(delivery(&id));
    }
    records
}

#[tokio::test]
async fn with_limits_on_a_task_of_a_warm_sandbox_costs_six_aws_requests() {
    let stack = Stack::new().await;
    let quick = Behaviour {
        page_time: Duration::from_millis(5),
        robots: (200, "User-agent: *\nAllow: /\n".into()),
        ..Behaviour::default()
    };
    let site = PoliteSite::start(quick).await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 40).await;
    // An in-flight limit that does not bind: the host's turn and its slot given back, the
    // two requests politeness adds (a rate limit rides the same turn).
    // The run's parents stay cached for the whole test: a warm sandbox reads them once a
    // TTL, not once a task, and on a loaded machine the warm-up and the deliveries after it
    // can outlast the default 5 s (one BatchGetItem more, seen in a run beside two others).
    let warm = |t: &mut WorkerTuning| t.parents_ttl = Duration::from_secs(600);
    let polite_worker = stack.worker_with(|t| {
        warm(t);
        t.politeness = polite(None, Some(16));
    });
    let plain_worker = stack.worker_with(warm);
    let warm_up = delivered(&stack, &site, (0, 10)).await;
    run_batch(&polite_worker, warm_up).await;
    let (polite_batch, plain_batch) = (
        delivered(&stack, &site, (10, 25)).await,
        delivered(&stack, &site, (25, 40)).await,
    );
    stack.calls.clear();

    let started = Instant::now();
    let reply = run_batch(&polite_worker, polite_batch).await;
    let polite_took = started.elapsed();
    let calls = stack.calls.calls().len();
    // A permit whose claim took over 250 ms (a loaded machine) reads the host's cooldown once
    // more before its fetch: one GetItem beyond the guard's, not a request of the task's own.
    let late_permits = stack.calls.count("GetItem").saturating_sub(15);
    let started = Instant::now();
    run_batch(&plain_worker, plain_batch).await;
    let plain_took = started.elapsed();

    assert!(retried(&reply).is_empty());
    assert_eq!(calls - late_permits, 15 * 6, "{:?}", stack.calls.calls());
    let extra = (polite_took.as_secs_f64() - plain_took.as_secs_f64()) * 1e3 / 15.0;
    println!(
        "politeness: 6 AWS requests a task with limits on; 15 tasks in {polite_took:?} against {plain_took:?} without ({extra:.1} ms a task, 16 at once, against the emulator)"
    );
}

/// The site's host cooling down for `seconds` more.
async fn cooling(stack: &Stack, site: &PoliteSite, seconds: u64) {
    let host = site.url("").trim_start_matches("http://").to_owned();
    stack.cool_host(&host, seconds).await;
}

#[tokio::test]
async fn a_wait_is_a_fresh_copy_due_later_and_past_the_longest_wait_the_task_fails() {
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    stack.put_active_run().await;
    stack
        .put_task("t000", &site.url("/page/0"), "pending")
        .await;
    cooling(&stack, &site, 4).await;
    let queue = Queue::create(&stack, 30).await;
    let max_wait = Duration::from_secs(60);
    let worker = stack.worker_with(|t| {
        t.politeness = Politeness {
            max_wait,
            ..polite(Some(5.0), Some(2))
        }
    });
    let on_queue = |body: String| {
        let mut record = record("m1", &body, 1);
        record.event_source_arn = Some(queue.arn.clone());
        record
    };
    // The same copy as if its first wait had begun 58 s ago, when the host cools down for
    // 30 s more: past its longest wait.
    let since = SystemTime::now() - Duration::from_secs(58);
    let since = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    let worn = format!(
        r#"{{"job_id":"job-1","run_id":"run-1","task_id":"t000","polite_waits":3,"polite_since":{}}}"#,
        since.as_millis()
    );

    let first = run_batch(&worker, vec![on_queue(body("t000"))]).await;
    let copy = queue
        .wait_for_redelivery(&stack, Duration::from_secs(10))
        .await;
    cooling(&stack, &site, 30).await;
    let last = run_batch(&worker, vec![on_queue(worn)]).await;

    assert!(retried(&first).is_empty(), "acked: its copy waits instead");
    assert!(
        copy.1 >= Duration::from_secs(3),
        "due after the cooldown, not before"
    );
    let copied = copy.0.body.as_deref();
    assert_eq!(
        conveyor_worker::domain::message::Carried::read(copied).waits,
        1
    );
    assert!(
        conveyor_worker::domain::message::Carried::read(copied)
            .polite_since
            .is_some()
    );
    assert!(
        retried(&last).is_empty(),
        "acked: failed, not dead-lettered"
    );
    let task = stack.task("t000").await;
    assert_eq!(task.status(), Some("failed"));
    assert_eq!(task.s("error"), Some("waited too long for its host"));
    assert_eq!(site.hits("/page"), 0);
}

/// Two sites of one shared host, on two ports of 127.0.0.1 under two names, for a job that
/// keys its politeness by `key` at 5 a second: both together keep one schedule.
async fn two_names_of_one_host_share_a_schedule(key: &str, names: [&'static str; 2]) {
    // Arrange
    let stack = Stack::new().await;
    let sites = [
        PoliteSite::start(Behaviour::default()).await,
        PoliteSite::start(Behaviour::default()).await,
    ];
    let mut job = keys::job_key(&id(JOB));
    job.insert("status".into(), attributes::s("active"));
    job.insert("politeness_key".into(), attributes::s(key));
    stack.put_item(job).await;
    let urls: Vec<String> = (0..40)
        .map(|i| {
            let port = url::Url::parse(&sites[i % 2].url("/"))
                .expect("a URL")
                .port();
            let port = port.expect("a site's port");
            format!("http://{}:{port}/page/{i}", names[i % 2])
        })
        .collect();
    let (queue, dlq) = tasks_at(&stack, &urls).await;
    let resolver = crate::fetching::names_also(&names);
    let tune = |t: &mut WorkerTuning| {
        t.politeness = polite(Some(5.0), Some(4));
        t.lookup = Some(resolver.clone());
    };

    // Act
    drain_tuned(&stack, &queue, &tune, SMALL_FLEET).await;

    // Assert: the two sites together got one host's rate. One schedule at 5 a second
    // spaces 40 starts over 7.8 s (two would take 3.9 s); the check at each start moves it
    // by the emulator's answer time, so 7 s at the least.
    assert!(statuses(&stack, 40).await.iter().all(|s| s == "successful"));
    assert_eq!(dlq.depth(&stack).await, 0);
    let mut starts: Vec<Instant> = sites
        .iter()
        .flat_map(|site| site.visits())
        .filter(|v| v.path.starts_with("/page"))
        .map(|v| v.started)
        .collect();
    starts.sort();
    let span = starts[starts.len() - 1] - starts[0];
    println!(
        "keyed by {key}: {} starts on the two sites over {span:?}",
        starts.len()
    );
    assert_eq!(starts.len(), 40, "each page once");
    assert!(span >= Duration::from_secs(7), "40 starts in {span:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_keyed_by_domain_gives_two_subdomains_of_a_site_one_schedule() {
    two_names_of_one_host_share_a_schedule("domain", ["a.shared.test", "b.shared.test"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_keyed_by_address_gives_two_sites_of_one_address_one_schedule() {
    two_names_of_one_host_share_a_schedule("address", ["one.test", "another.test"]).await;
}

#[test]
#[should_panic(expected = "t007 fetched 2 times, at most 1")]
fn a_page_fetched_twice_fails_the_count_unless_its_own_message_was_doubled() {
    // One doubled delivery, and one page fetched twice: the total (301 of 300) is within
    // the old bound of "N + doubled", but the page fetched twice is not the doubled one.
    let fetches: BTreeMap<String, usize> = (0..300)
        .map(|i| (format!("t{i:03}"), if i == 7 { 2 } else { 1 }))
        .collect();
    let doubled = HashMap::from([("t005".to_owned(), 1)]);

    assert_once_each_but_doubled("fetched", &fetches, &doubled);
}

#[test]
fn a_page_fetched_twice_passes_the_count_when_its_message_was_doubled() {
    let fetches: BTreeMap<String, usize> = (0..300)
        .map(|i| (format!("t{i:03}"), if i == 5 { 2 } else { 1 }))
        .collect();
    let doubled = HashMap::from([("t005".to_owned(), 1)]);

    assert_once_each_but_doubled("fetched", &fetches, &doubled);
}
