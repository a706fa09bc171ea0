//! Politeness as deployed: the production defaults (`HOST_MAX_INFLIGHT` 2, robots.txt
//! obeyed, the sleep, the longest wait), a job's own rate where the test says so, several
//! sandboxes behind the local event source mapping on the emulator's real SQS, against
//! logged local sites. A one-host run many times its host's rate drains at that rate; a
//! failing host costs each task exactly its attempts; a push-back only lengthens; a URL our
//! own rules refuse never touches its host.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use conveyor_testkit::polite_site::{Behaviour, PoliteSite};
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::polite::Politeness;
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::wiring::config::Config;

use crate::politeness::{
    Fleet, assert_once_each_but_doubled, by_operation, drain_with, pages, statuses, tasks_of,
};

/// The politeness a deployed function has: every default of `Config`, nothing switched off.
pub(crate) fn production_defaults() -> Politeness {
    let required =
        |name: &str| matches!(name, "TABLE_NAME" | "RESULTS_BUCKET").then(|| "required".to_owned());
    Config::from_lookup(required)
        .expect("the defaults")
        .politeness
}

/// The job, active, with its own rate for its hosts (data contract v2), and in-flight limit
/// if given; the fleet's defaults for everything else.
async fn polite_job(stack: &Stack, max_rps: f64, max_inflight: Option<u32>) {
    let Some(inflight) = max_inflight else {
        return stack.put_polite_job(JOB, max_rps).await;
    };
    let mut item = keys::job_key(&id(JOB));
    item.insert("status".into(), attributes::s("active"));
    item.insert("host_max_rps".into(), attributes::n(max_rps));
    item.insert("host_max_inflight".into(), attributes::n(inflight));
    stack.put_item(item).await;
}

/// Three sandboxes of two pollers each; invocations long enough for robots.txt's own
/// timeout (10 s) and a fetch.
const FLEET: Fleet = Fleet {
    sandboxes: 3,
    pollers: 2,
    timeout: Duration::from_secs(20),
    limit: Duration::from_secs(180),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_of_300_pages_of_one_host_drains_at_its_rate_with_nothing_dead_lettered() {
    // Arrange: 300 tasks of one host at 5 a second: 60 s of the host's rate.
    let stack = Stack::new().await;
    let quick = Behaviour {
        page_time: Duration::from_millis(50),
        ..Behaviour::default()
    };
    let site = PoliteSite::start(quick).await;
    let (tasks, rate) = (300, 5.0);
    polite_job(&stack, rate, None).await;
    let (queue, dlq) = tasks_of(&stack, &pages(&site, "page", tasks)).await;
    stack.calls.clear();

    // Act
    let drained = drain_with(&stack, &queue, production_defaults(), FLEET).await;

    // Assert: all fetched once, at the host's rate, in about N/r, for few requests a task.
    assert!(
        statuses(&stack, tasks)
            .await
            .iter()
            .all(|s| s == "successful")
    );
    assert_eq!(dlq.depth(&stack).await, 0, "nothing dead-lettered");
    // Once, but for a message the queue handed two pollers at the same moment (both
    // scrape under the default DUPLICATE_POLICY=converge; moto's SQS does this at times):
    // its page, and no other, may have been fetched twice.
    let visits = site.visits();
    let fetches = fetches_by_task(&visits, 0..tasks, |i| {
        (format!("/page/{i}"), format!("t{i:03}"))
    });
    assert_once_each_but_doubled("fetched", &fetches, &drained.doubled);
    assert_eq!(
        site.hits("/page"),
        fetches.values().sum::<usize>(),
        "no other page"
    );
    assert_eq!(site.hits("/robots.txt"), 1, "once for the fleet");
    // The host's rate over any 5 s. The fleet books a start every 200 ms; a start the machine
    // makes late (a wake-up, a connection) may land beside the next one, so a single
    // second's count measures the machine too (7 once, on a loaded clean run). Over 5 s that
    // lateness is worth at most a second's starts; two schedules for one host would be 50.
    let most = site.most_started_within(Duration::from_secs(5));
    let in_a_second = site.most_started_within(Duration::from_secs(1));
    println!("the host's most starts: {most} in 5 s, {in_a_second} in a second");
    assert!(
        most <= 30,
        "{most} starts in 5 s: 5 a second, and a second's more"
    );
    assert!(site.most_in_flight() <= 2, "the default in-flight limit");
    let calls = stack.calls.calls();
    let per_task = |n: usize| n as f64 / tasks as f64;
    let (requests, copies) = (
        per_task(calls.len()),
        per_task(stack.calls.count("SendMessage")),
    );
    let ideal = tasks as f64 / rate;
    let (took, backlog_read) = (drained.took, drained.backlog_read.unwrap_or_default());
    println!(
        "politeness at the defaults: {tasks} tasks of one host at {rate}/s drained in {took:?} \
         (N/r = {ideal} s; the mapping first read its whole backlog in {backlog_read:?}), \
         {copies:.2} copies and {requests:.2} AWS requests a task; {}",
        by_operation(&calls)
    );
    assert!(copies <= 2.0, "{copies:.2} copies a task");
    assert!(requests <= 10.0, "{requests:.2} AWS requests a task");
    // 10% over the schedule the fleet booked (N starts, and one more for each copy past
    // one a task: a start missed and booked again), plus the mapping's polling delay: the
    // time it took to first read its backlog, the pollers' pauses, and the three empty
    // checks that end the drain.
    let booked = tasks as f64 * copies.max(1.0);
    let bound = Duration::from_secs_f64(booked / rate * 1.1 + 5.0) + backlog_read;
    assert!(
        took <= bound,
        "{took:?} for {booked} starts at the host's rate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_answering_503_to_everything_fails_each_task_after_exactly_max_attempts_fetches() {
    // Arrange: a host that answers every page with a bare 503; a job rate high enough that
    // the push-backs' slowdown (up to 64 intervals) stays a second or so.
    let stack = Stack::new().await;
    let failing = Behaviour {
        page_time: Duration::from_millis(20),
        fail_next: usize::MAX,
        ..Behaviour::default()
    };
    let site = PoliteSite::start(failing).await;
    let tasks = 3;
    polite_job(&stack, 50.0, None).await;
    let (queue, dlq) = tasks_of(&stack, &pages(&site, "page", tasks)).await;

    // Act
    drain_with(&stack, &queue, production_defaults(), FLEET).await;

    // Assert: every task failed on its last attempt, each fetched exactly MAX_ATTEMPTS times
    // whatever waits and copies came between, and none dead-lettered.
    assert!(statuses(&stack, tasks).await.iter().all(|s| s == "failed"));
    assert_eq!(dlq.depth(&stack).await, 0, "nothing dead-lettered");
    for i in 0..tasks {
        let task = stack.task(&format!("t{i:03}")).await;
        assert_eq!(task.s("error"), Some("HTTP 503"));
        let fetches = site.hits(&format!("/page/{i}"));
        assert_eq!(fetches, MAX_ATTEMPTS as usize, "task {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_429s_long_retry_after_keeps_the_fleet_away_although_bare_503s_follow() {
    // Arrange: the first page answers 429 with Retry-After: 12 at once; the three fetches
    // already in flight then answer bare 503s, whose own cooldown would be a second.
    let stack = Stack::new().await;
    let pushing_back = Behaviour {
        page_time: Duration::from_millis(300),
        refuse_next: (1, 12),
        fail_next: 3,
        ..Behaviour::default()
    };
    let site = PoliteSite::start(pushing_back).await;
    let tasks = 10;
    polite_job(&stack, 20.0, Some(4)).await;
    let (queue, dlq) = tasks_of(&stack, &pages(&site, "page", tasks)).await;

    // Act
    drain_with(&stack, &queue, production_defaults(), FLEET).await;

    // Assert: nobody went back within the Retry-After; then every task succeeded.
    assert!(
        statuses(&stack, tasks)
            .await
            .iter()
            .all(|s| s == "successful")
    );
    assert_eq!(dlq.depth(&stack).await, 0);
    let visits = site.visits();
    let refused = visits
        .iter()
        .find(|v| v.path.starts_with("/page"))
        .expect("a page visit");
    // Fetches granted before the 429 was recorded (a read and a write after it, on the
    // emulator of a loaded 2-core CI machine: CI saw one start 1.7 s after) may still start
    // within the first two seconds; none after, for the rest of the Retry-After.
    let (recorded, quiet_until) = (
        refused.ended + Duration::from_secs(2),
        refused.ended + Duration::from_secs(12),
    );
    let during: Vec<_> = visits
        .iter()
        .filter(|v| v.started > recorded && v.started < quiet_until)
        .map(|v| v.started - refused.ended)
        .collect();
    assert!(
        during.is_empty(),
        "fetches within Retry-After, at {during:?}"
    );
}

#[tokio::test]
async fn a_url_our_rules_refuse_fails_at_its_first_delivery_without_touching_its_host() {
    // Arrange: a loopback literal, private networks not allowed (as deployed).
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack
        .put_task("t000", "http://127.0.0.1:8080/admin", "pending")
        .await;
    let worker = stack.worker_with(|t| {
        t.allow_private_networks = false;
        t.politeness = production_defaults();
    });

    // Act
    let reply = run_batch(&worker, vec![delivery("t000")]).await;

    // Assert: failed for good on this delivery; no host item, no robots.txt, no wait.
    assert!(retried(&reply).is_empty());
    let task = stack.task("t000").await;
    assert_eq!(task.status(), Some("failed"));
    let reason = task.s("error").unwrap_or_default();
    assert!(reason.contains("not on the public internet"), "{reason}");
    for sk in ["HOST", "ROBOTS"] {
        let item = stack
            .dynamodb
            .get_item()
            .table_name(&stack.table)
            .set_key(Some(keys::host_key("127.0.0.1:8080", sk)))
            .send()
            .await
            .expect("read the host's item");
        assert!(item.item.is_none(), "the host's {sk} item was written");
    }
    assert_eq!(stack.calls.count("SendMessage"), 0, "no wait");
}

#[tokio::test]
async fn records_of_one_host_that_arrive_together_book_their_starts_in_one_write() {
    // Arrange: a host whose schedule is booked a minute ahead, its robots.txt known; a job
    // rate of 5 a second; ten records of it in one batch, on a queue to send copies to.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    let host = site.url("").trim_start_matches("http://").to_owned();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    let booked_until = now.as_millis() as u64 + 60_000;
    let mut schedule = keys::host_key(&host, "HOST");
    schedule.insert("next_start".into(), attributes::n(booked_until));
    stack.put_item(schedule).await;
    let mut robots = keys::host_key(&host, "ROBOTS");
    robots.insert("status".into(), attributes::s("allow_all"));
    robots.insert(
        "expires_at".into(),
        attributes::n(booked_until + 86_400_000),
    );
    stack.put_item(robots).await;
    polite_job(&stack, 5.0, None).await;
    stack.put_run(JOB, RUN, "running").await;
    let queue = Queue::create(&stack, 30).await;
    let mut records = Vec::new();
    for i in 0..10 {
        let id = format!("t{i:03}");
        stack
            .put_task(&id, &site.url(&format!("/page/{i}")), "pending")
            .await;
        let mut record = delivery(&id);
        record.event_source_arn = Some(queue.arn.clone());
        records.push(record);
    }
    let worker = stack.worker_with(|t| t.politeness = production_defaults());
    stack.calls.clear();

    // Act
    let reply = run_batch(&worker, records).await;

    // Assert: ten consecutive starts booked, in a write or two, and ten copies sent.
    assert!(retried(&reply).is_empty(), "acked: their copies wait");
    let item = stack
        .dynamodb
        .get_item()
        .table_name(&stack.table)
        .set_key(Some(keys::host_key(&host, "HOST")))
        .send()
        .await
        .expect("read the host's item")
        .item
        .unwrap_or_default();
    let next_start: u64 = item["next_start"]
        .as_n()
        .expect("a number")
        .parse()
        .expect("ms");
    assert_eq!(
        next_start - booked_until,
        10 * 200,
        "ten starts, 200 ms apart"
    );
    let writes = stack.calls.count("UpdateItem");
    assert!(writes <= 2, "{writes} writes for ten bookings");
    assert_eq!(stack.calls.count("SendMessage"), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_run_gives_its_hosts_bookings_back_to_the_next_runs_tasks() {
    // Arrange: a run of 200 pages of one host at 4 a second (50 s of the host), drained at
    // the production defaults.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    let (first, rate) = (200, 4.0);
    polite_job(&stack, rate, None).await;
    let (queue, dlq) = tasks_of(&stack, &pages(&site, "first", first)).await;
    let host = site.url("").trim_start_matches("http://").to_owned();

    // Act: once the run has booked its host 30 s ahead, it is cancelled and a second run of
    // 10 pages of the host is sent.
    let act = async {
        booked_ahead(&stack, &host, 30_000).await;
        stack.put_run(JOB, RUN, "cancelled").await;
        let booked_until = stack.host_item(&host, "HOST").await.n("next_start");
        let submitted = (std::time::Instant::now(), now_ms());
        stack.put_counted_run(JOB, "second", 10).await;
        let mut bodies = Vec::new();
        for i in 0..10 {
            let (task, url) = (format!("s{i:02}"), site.url(&format!("/second/{i}")));
            stack
                .put_task_in(JOB, "second", &task, &url, "pending")
                .await;
            let body = serde_json::json!({"job_id": JOB, "run_id": "second", "task_id": task});
            bodies.push(body.to_string());
        }
        queue.send_batch(&stack, &bodies).await;
        (booked_until, submitted)
    };
    let fleet = drain_with(&stack, &queue, production_defaults(), FLEET);
    let (drained, (booked_until, (submitted, submitted_ms))) = tokio::join!(fleet, act);

    // Assert: the cancelled run had booked its host far ahead, and the second run did not
    // wait behind those starts.
    let ahead = booked_until
        .expect("the cancelled run booked ahead")
        .saturating_sub(submitted_ms);
    assert!(ahead > 30_000, "the run booked only {ahead} ms ahead");
    for i in 0..10 {
        let task = stack.task_in(JOB, "second", &format!("s{i:02}")).await;
        assert_eq!(task.status(), Some("successful"), "s{i:02}");
    }
    // Once, but for a message the queue handed two pollers at once (moto's SQS does this).
    let visits = site.visits();
    let fetches = fetches_by_task(&visits, 0..10, |i| {
        (format!("/second/{i}"), format!("s{i:02}"))
    });
    assert_once_each_but_doubled("fetched", &fetches, &drained.doubled);
    let last = (site.visits().iter())
        .filter(|v| v.path.starts_with("/second/"))
        .map(|v| v.started.saturating_duration_since(submitted))
        .max()
        .expect("the second run's pages were fetched");
    println!(
        "booked ahead by the cancelled run: {ahead} ms; the second run's last start: {last:?}"
    );
    // What the fleet decided, not how fast this machine served it: the stretch was given
    // back, and the second run's starts were booked inside it, so the schedule now ends
    // before the cancelled run's bookings would have (10 starts at 4 a second; had the
    // second run booked behind them, it would end 2.5 s after).
    let item = stack.host_item(&host, "HOST").await;
    assert!(
        item.n("given_back_from").is_some(),
        "the stretch was given back"
    );
    let (booked_until, next) = (booked_until.unwrap_or(0), item.n("next_start"));
    assert!(
        next.is_some_and(|next| next < booked_until),
        "the schedule ends at {next:?}, the cancelled run's at {booked_until}"
    );
    assert_eq!(dlq.depth(&stack).await, 0, "nothing dead-lettered");
}

/// Waits until the host's schedule is booked `ms` ahead (at most a minute).
async fn booked_ahead(stack: &Stack, host: &str, ms: u64) {
    for _ in 0..240 {
        let next = stack.host_item(host, "HOST").await.n("next_start");
        if next.is_some_and(|next| next > now_ms() + ms) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the host was never booked {ms} ms ahead");
}

/// Milliseconds since the Unix epoch, as the host's item keeps its starts.
fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fifo_group_cut_by_the_deadline_drains_at_its_hosts_rate_without_missed_bookings() {
    // Arrange: one FIFO group of 12 tasks of one host at the default rate (1 a second),
    // invocations of 4 s, so every batch of the group is cut by its deadline.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    stack.put_job(JOB, "active").await;
    let tasks = 12;
    stack.put_counted_run(JOB, RUN, tasks as u32).await;
    let mut bodies = Vec::new();
    for (i, (site, path)) in pages(&site, "page", tasks).into_iter().enumerate() {
        let task = format!("t{i:03}");
        stack.put_task(&task, &site.url(&path), "pending").await;
        bodies.push((body(&task), Some("g".to_owned())));
    }
    let dlq = Queue::create_fifo(&stack, 30, None).await;
    let queue = Queue::create_fifo(&stack, 30, Some((&dlq, MAX_ATTEMPTS))).await;
    for chunk in bodies.chunks(10) {
        queue.send_grouped(&stack, chunk).await;
    }
    let cut = Fleet {
        sandboxes: 2,
        pollers: 1,
        timeout: Duration::from_secs(4),
        limit: Duration::from_secs(120),
    };

    // Act
    let drained = drain_with(&stack, &queue, production_defaults(), cut).await;

    // Assert: every task fetched once, nothing dead-lettered, and no start left booked past
    // the group's last fetch.
    assert!(
        statuses(&stack, tasks)
            .await
            .iter()
            .all(|s| s == "successful")
    );
    assert_eq!(dlq.depth(&stack).await, 0, "nothing dead-lettered");
    let visits: Vec<_> = (site.visits().into_iter())
        .filter(|v| v.path.starts_with("/page/"))
        .collect();
    // (A record held on the receive before its last goes to the back of its group, so the
    // order may change; a page is still fetched once.)
    let fetches = fetches_by_task(&visits, 0..tasks, |i| {
        (format!("/page/{i}"), format!("t{i:03}"))
    });
    assert_once_each_but_doubled("fetched", &fetches, &drained.doubled);
    let host = site.url("").trim_start_matches("http://").to_owned();
    let item = stack.host_item(&host, "HOST").await;
    let (first, last) = (visits[0].started, visits[visits.len() - 1].started);
    let span_ms = (last - first).as_millis() as u64;
    let booked_past = item.n("next_start").unwrap_or(0).saturating_sub(now_ms());
    println!("12 pages over {span_ms} ms; the schedule ends {booked_past} ms ahead");
    assert!(
        span_ms >= 11 * 900,
        "faster than the host's rate: {span_ms} ms"
    );
    assert!(
        booked_past <= 1_000,
        "nothing is booked past the group's last fetch: {booked_past} ms ahead"
    );
}

/// How many times each task's page was fetched, by task id: `names` gives the page's path and
/// the task's id for each of `tasks`.
fn fetches_by_task(
    visits: &[conveyor_testkit::polite_site::Visit],
    tasks: std::ops::Range<usize>,
    names: impl Fn(usize) -> (String, String),
) -> BTreeMap<String, usize> {
    tasks
        .map(|i| {
            let (path, task) = names(i);
            (task, visits.iter().filter(|v| v.path == path).count())
        })
        .collect()
}
