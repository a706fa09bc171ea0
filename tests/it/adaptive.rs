//! Adaptive politeness against sites that behave as real ones do under load, through the
//! local event source mapping with three sandboxes at the production defaults (a job's own
//! ceiling where the test says so): a real nginx whose `limit_req` answers 429, a site that
//! serves one request at a time and answers 503 past a short queue, a storm of 500s, a site
//! that stops answering, and a healthy one. Each test prints its figures; docs/fetching.md
//! sets them beside the fixed ceiling's.

use std::time::{Duration, Instant};

use conveyor_testkit::host_watch::{HostWatch, Look};
use conveyor_testkit::nginx::RateLimitedSite;
use conveyor_testkit::queue::Queue;
use conveyor_testkit::troubled_site::{PageVisit, Trouble, TroubledSite};
use conveyor_testkit::*;

use crate::polite_defaults::production_defaults;
use crate::politeness::{Drained, Fleet, drain_tuned, statuses, tasks_at};

/// Three sandboxes of two pollers each, as in `polite_defaults`, with time for a run at a
/// site's learned pace.
const FLEET: Fleet = Fleet {
    sandboxes: 3,
    pollers: 2,
    timeout: Duration::from_secs(20),
    limit: Duration::from_secs(300),
};

/// Drains the queue with [`FLEET`] at the production defaults, fetches cut at `timeout`.
async fn drain(stack: &Stack, queue: &Queue, timeout: Duration) -> Drained {
    init_logs();
    let tune = |t: &mut WorkerTuning| {
        t.politeness = production_defaults();
        t.scrape_timeout = timeout;
    };
    drain_tuned(stack, queue, &tune, FLEET).await
}

/// The tasks of a run at a troubled site, for a job with its own ceiling (and in-flight
/// limit, if given), and the run's queue and dead-letter queue.
async fn troubled_run(
    trouble: Trouble,
    (tasks, max_rps, max_inflight): (usize, f64, Option<u32>),
) -> (Stack, TroubledSite, (Queue, Queue)) {
    let stack = Stack::new().await;
    let site = TroubledSite::start(trouble).await;
    stack.put_limited_job(JOB, max_rps, max_inflight).await;
    let urls: Vec<String> = (0..tasks).map(|i| site.page_url(i)).collect();
    let queues = tasks_at(&stack, &urls).await;
    (stack, site, queues)
}

/// Pages a second over the site's log: the pages it served, from its first request to the
/// end of its last page.
fn pages_a_second(visits: &[PageVisit]) -> f64 {
    let pages: Vec<_> = visits.iter().filter(|v| v.status == Some(200)).collect();
    let first = visits.iter().map(|v| v.arrived).min();
    let last = pages.iter().filter_map(|v| v.ended).max();
    match (first, last) {
        (Some(first), Some(last)) => pages.len() as f64 / (last - first).as_secs_f64(),
        _ => 0.0,
    }
}

/// Requests a second the fleet held at the site over the middle 80% of its requests: the
/// run's pace, without the local mapping's first read of its backlog (the copies booked
/// meanwhile wait behind it in the queue) and the last pages' tail, which any pace has.
fn steady_pace(visits: &[PageVisit]) -> f64 {
    let mut arrivals: Vec<Instant> = visits.iter().map(|v| v.arrived).collect();
    arrivals.sort();
    let (from, to) = (
        arrivals.len() / 10,
        arrivals.len() - arrivals.len() / 10 - 1,
    );
    (to - from) as f64 / (arrivals[to] - arrivals[from]).as_secs_f64()
}

/// Starts the site's trouble once it has served `after` pages (the fleet is at full pace).
fn trouble_after(site: &TroubledSite, after: usize, start: fn(&TroubledSite)) {
    let site = site.clone();
    tokio::spawn(async move {
        while site.count(|v| v.status == Some(200)) < after {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        start(&site);
    });
}

/// Every task ended successful, and no message of the run was dead-lettered (its bodies
/// are printed if one was).
async fn all_successful(stack: &Stack, dlq: &Queue, tasks: usize) {
    let dead: Vec<_> = dlq.drain(stack).await.into_iter().map(|m| m.body).collect();
    let ended = statuses(stack, tasks).await;
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
    assert!(ended.iter().all(|s| s == "successful"), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_real_nginx_limiting_to_2_a_second_is_learned_and_run_at_most_of_its_rate() {
    // Arrange: nginx's limit_req at 2 a second (429 without Retry-After) with the burst of
    // nginx's own example (5, nodelay: a request a little early is let through, as real
    // configurations do), and the job's ceiling 10 a second: five times what it allows.
    let stack = Stack::new().await;
    let tasks = 150;
    let site = RateLimitedSite::start(2, 5, tasks).await;
    stack.put_limited_job(JOB, 10.0, None).await;
    let urls: Vec<String> = (0..tasks).map(|i| site.page_url(i)).collect();
    let (queue, dlq) = tasks_at(&stack, &urls).await;
    let watch = HostWatch::start(&stack, &urls[0]);

    // Act
    drain(&stack, &queue, Duration::from_secs(30)).await;

    // Assert: after the first 20 s at most 5% of answers are 429, and the pace the fleet
    // decided on is >= 80% of 2/s (the pace the site saw is printed: it also measures this
    // machine).
    all_successful(&stack, &dlq, tasks).await;
    let looks = watch.looks();
    let answers = site.answers();
    let first = answers.first().expect("answers").at;
    let late: Vec<_> = answers
        .iter()
        .filter(|a| a.at.duration_since(first).unwrap_or_default() >= Duration::from_secs(20))
        .collect();
    let refused = late.iter().filter(|a| a.status == 429).count() as f64 / late.len() as f64;
    let last_page = answers
        .iter()
        .rev()
        .find(|a| a.status == 200)
        .expect("a page")
        .at;
    let span = last_page.duration_since(first).unwrap_or_default();
    let rate = tasks as f64 / span.as_secs_f64();
    let all_refused = answers.iter().filter(|a| a.status == 429).count();
    let learned = first + Duration::from_secs(20);
    let window = (ms_since_epoch(learned), ms_since_epoch(last_page));
    let decided = decided_pace(&looks, window, 10.0);
    println!(
        "nginx at 2/s (burst 5), ceiling 10/s: {tasks} pages in {span:?} ({rate:.2}/s), {} requests, \
         {all_refused} answered 429, {:.1}% of those from 20 s on; decided {decided:.2}/s from 20 s on",
        answers.len(),
        refused * 100.0
    );
    assert!(refused <= 0.05, "{:.1}% 429s after 20 s", refused * 100.0);
    assert!(
        decided >= 0.8 * 2.0,
        "decided on {decided:.2} pages a second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_site_serving_one_request_at_a_time_is_run_near_its_capacity_with_few_errors() {
    // Arrange: one page at a time, 200 ms each (5 a second), 503 past two waiting; the job's
    // ceiling 20 a second and 10 in flight (with the default 2 in flight the in-flight limit
    // alone would keep the queue short: this is the rate's test).
    let tasks = 200;
    let serial = Trouble::Serial {
        page_time: Duration::from_millis(200),
        queue: 2,
    };
    let (stack, site, (queue, dlq)) = troubled_run(serial, (tasks, 20.0, Some(10))).await;
    let watch = HostWatch::start(&stack, &site.page_url(0));

    // Act
    drain(&stack, &queue, Duration::from_secs(30)).await;

    // Assert: at most 5% errors; over the run the fleet decided on a pace of at least
    // capacity / 1.5 (the pace the site saw is printed: it also measures this machine).
    all_successful(&stack, &dlq, tasks).await;
    let looks = watch.looks();
    let visits = site.visits();
    let errors = site.status_share(503);
    let rate = pages_a_second(&visits);
    let first = visits.iter().map(|v| v.arrived_at).min().expect("a visit");
    let last = visits.iter().map(|v| v.arrived_at).max().expect("a visit");
    let decided = decided_pace(&looks, (ms_since_epoch(first), ms_since_epoch(last)), 20.0);
    println!(
        "one at a time (5/s), ceiling 20/s: {tasks} pages at {rate:.2}/s ({:.1} s), \
         {} requests, {:.1}% answered 503; decided {decided:.2}/s",
        tasks as f64 / rate,
        visits.len(),
        errors * 100.0
    );
    assert!(errors <= 0.05, "{:.1}% errors", errors * 100.0);
    assert!(
        decided >= 5.0 / 1.5,
        "decided on {decided:.2} pages a second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_500s_is_asked_a_few_times_and_every_task_succeeds_after_it() {
    // Arrange: a 50 ms site that answers 500 to everything for 15 s once it has served 30
    // pages; the job's ceiling 10 a second.
    let tasks = 150;
    let storm = Trouble::Storm {
        status: 500,
        lasting: Duration::from_secs(15),
        page_time: Duration::from_millis(50),
    };
    let (stack, site, (queue, dlq)) = troubled_run(storm, (tasks, 10.0, None)).await;
    trouble_after(&site, 30, TroubledSite::storm_now);

    // Act
    drain(&stack, &queue, Duration::from_secs(30)).await;

    // Assert: at most 30% of the ceiling's 150 requests reach it in the storm.
    all_successful(&stack, &dlq, tasks).await;
    let (from, to) = site.storm_window().expect("the storm came");
    let in_storm = site.arrivals_within(from, to);
    println!(
        "500s for 15 s, ceiling 10/s: {in_storm} requests in the storm (the ceiling's 150), \
         {} in all for {tasks} pages",
        site.visits().len()
    );
    assert!(in_storm <= 45, "{in_storm} requests in the storm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_site_that_stops_answering_is_asked_little_until_it_answers_again() {
    // Arrange: a 50 ms site that answers nothing for 20 s once it has served 30 pages;
    // fetches time out after 3 s; the job's ceiling 10 a second and 8 in flight.
    let tasks = 150;
    let silent = Trouble::Silent {
        lasting: Duration::from_secs(20),
        page_time: Duration::from_millis(50),
    };
    let (stack, site, (queue, dlq)) = troubled_run(silent, (tasks, 10.0, Some(8))).await;
    trouble_after(&site, 30, TroubledSite::silence_now);

    // Act
    drain(&stack, &queue, Duration::from_secs(3)).await;

    // Assert: at most 20 requests reach it while it is silent; then everything succeeds.
    all_successful(&stack, &dlq, tasks).await;
    let (from, to) = site.silence_window().expect("the silence came");
    let in_silence = site.arrivals_within(from, to);
    println!(
        "silent for 20 s (3 s timeouts), ceiling 10/s, 8 in flight: {in_silence} requests in \
         the silence, {} in all for {tasks} pages",
        site.visits().len()
    );
    assert!(in_silence <= 20, "{in_silence} requests in the silence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_healthy_fast_site_runs_at_its_ceiling() {
    // Arrange: a 20 ms site, the job's ceiling 10 a second.
    let tasks = 150;
    let healthy = Trouble::Healthy {
        page_time: Duration::from_millis(20),
    };
    let (stack, site, (queue, dlq)) = troubled_run(healthy, (tasks, 10.0, None)).await;
    let watch = HostWatch::start(&stack, &site.page_url(0));
    let started = Instant::now();

    // Act
    let drained = drain(&stack, &queue, Duration::from_secs(30)).await;

    // Assert: the fleet never slowed the host, cooled it down or took it for failing, and
    // fetched each page once. (The pace the site saw is printed: it also measures how fast
    // this machine carries the records, which the worker does not decide.)
    all_successful(&stack, &dlq, tasks).await;
    let looks = watch.looks();
    let visits = site.visits();
    println!(
        "healthy 20 ms, ceiling 10/s: {tasks} pages at {:.2}/s over the middle 80% \
         ({:.2}/s from the first request to the last page), {} requests, drained in {:?}, \
         {} looks at the host, the most slowdown {:.2}; {:.1} deliveries a task",
        steady_pace(&visits),
        pages_a_second(&visits),
        visits.len(),
        started.elapsed(),
        looks.len(),
        most_slowdown(&looks),
        drained.received as f64 / tasks as f64
    );
    assert_eq!(visits.len(), tasks, "each page once");
    assert!(looks.len() >= 10, "{} looks", looks.len());
    assert!(most_slowdown(&looks) <= 1.0, "slowed: {looks:?}");
    assert!(looks.iter().all(|l| !l.cooling && !l.failing), "{looks:?}");
}

fn ms_since_epoch(at: std::time::SystemTime) -> u64 {
    let since = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    since.as_millis() as u64
}

/// The most slowdown any look saw.
fn most_slowdown(looks: &[Look]) -> f64 {
    looks.iter().map(|l| l.slowdown).fold(1.0, f64::max)
}

/// The pace the fleet decided on average over the looks within `(from, to)` (ms since the
/// epoch), at the job's ceiling `max_rps`: the ceiling over the slowdown in force, or 0
/// while the host cooled down.
fn decided_pace(looks: &[Look], (from, to): (u64, u64), max_rps: f64) -> f64 {
    let paces: Vec<f64> = looks
        .iter()
        .filter(|l| (from..=to).contains(&l.at))
        .map(|l| if l.cooling { 0.0 } else { max_rps / l.slowdown })
        .collect();
    assert!(paces.len() >= 10, "{} looks in the window", paces.len());
    paces.iter().sum::<f64>() / paces.len() as f64
}
