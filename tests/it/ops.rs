//! The operator's tool against the emulator: `conveyor-ops poll` drains a queue the way
//! Lambda's event source mapping would, with the worker configured from the environment;
//! `progress`, `requeue-failed` and `replay-quarantine` do the runbook's routines.

use std::process::{Output, Stdio};
use std::time::Duration;

use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::wiring::config::DuplicatePolicy;
use tokio::process::Command;

/// `conveyor-ops` with these arguments and the worker's settings for `stack`, to run.
pub(crate) fn ops_command(stack: &Stack, args: &[&str]) -> Command {
    let mut command = Command::new(ops_binary());
    command
        .args(args)
        .envs(scenario::ops_env(stack))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `conveyor-ops` with these arguments and the worker's settings for `stack`.
pub(crate) async fn ops(stack: &Stack, args: &[&str]) -> Output {
    ops_command(stack, args)
        .output()
        .await
        .expect("run conveyor-ops")
}

/// A list file of these lines (`conveyor-ops submit --urls`).
pub(crate) fn list(lines: &[String]) -> String {
    let path = std::env::temp_dir().join(unique("urls"));
    std::fs::write(&path, lines.join("\n")).expect("write the list");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// `conveyor-ops poll` of `queue_url` until it drains (a minute at most): what it printed.
pub(crate) async fn poll_until_drained(stack: &Stack, queue_url: &str) -> String {
    let drain = [
        "poll",
        "--queue-url",
        queue_url,
        "--until-drained",
        "--limit",
        "1m",
    ];
    drained(&ops(stack, &drain).await)
}

/// The standard output of a `poll` that drained its queue: exit code 0, or 4 when some
/// messages went to the dead-letter queue.
pub(crate) fn drained(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 4)), "{stdout}{stderr}");
    stdout
}

/// Its standard output, after checking it succeeded.
pub(crate) fn succeeded(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout
}

/// `requeue-failed` of the test run onto this queue.
fn requeue_failed(queue_url: &str) -> [&str; 7] {
    [
        "requeue-failed",
        "--job",
        JOB,
        "--run",
        RUN,
        "--queue-url",
        queue_url,
    ]
}

/// A counted run of a fine page and a page that fails for good (404), both delivered once.
async fn run_with_one_failure(stack: &Stack, site: &Site, failing_path: &str, receives: u32) {
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 2).await;
    stack
        .put_task("fine", &site.url("/page/fine"), "pending")
        .await;
    stack
        .put_task("bad", &site.url(failing_path), "pending")
        .await;
    let records = vec![delivery("fine"), record("bad", &body("bad"), receives)];
    let reply = run_batch(&stack.worker(), records).await;
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("bad").await.status(), Some("failed"));
}

const TASKS: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_until_drained_ends_every_task_of_a_run_exactly_once() {
    // Arrange: a counted run over fine, flaky, gone, slow and dead pages, some messages
    // sent three times.
    let prepared = scenario::prepare(TASKS, DuplicatePolicy::Converge).await;

    // Act
    let out = Command::new(ops_binary())
        .args([
            "poll",
            "--queue-url",
            &prepared.queue.url,
            "--until-drained",
        ])
        .args(["--limit", "2m", "--timeout", "10s", "--wait-seconds", "1"])
        .args(["--progress-every", "1s"])
        .envs(scenario::ops_env(&prepared.stack))
        // What each record came to, told if an assertion fails.
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run conveyor-ops");

    // Assert: it drained the queue and said so; every invariant of the run holds.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("drained after ")),
        "{stdout}"
    );
    assert!(stdout.contains(" queued "), "progress lines: {stdout}");
    let report = prepared.check(None, 0.0, "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let told = format!("{}\n{stdout}{stderr}", report.line());
    assert_eq!(report.successful + report.failed, TASKS, "{told}");
    assert_eq!(report.dead_lettered, 0, "{told}");
    assert!(
        report.counters.starts_with("run completed:"),
        "{}",
        report.counters
    );
}

#[tokio::test]
async fn poll_refuses_to_start_without_the_worker_settings() {
    // Arrange: no TABLE_NAME or RESULTS_BUCKET.
    let mut command = Command::new(ops_binary());
    command
        .args([
            "poll",
            "--queue-url",
            "http://127.0.0.1:9/000000000000/none",
        ])
        .env_remove("TABLE_NAME")
        .env_remove("RESULTS_BUCKET");

    // Act
    let out = command.output().await.expect("run conveyor-ops");

    // Assert: it fails at once, naming what is missing.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("TABLE_NAME"), "{stderr}");
}

#[tokio::test]
async fn progress_shows_counters_tasks_by_status_and_why_tasks_failed() {
    // Arrange
    let (stack, site) = (Stack::new().await, Site::start().await);
    run_with_one_failure(&stack, &site, "/status/404", 1).await;

    // Act
    let out = ops(&stack, &["progress", "--job", JOB, "--run", RUN]).await;

    // Assert
    let stdout = succeeded(&out);
    for line in [
        "  status           completed",
        "  tasks_succeeded  1",
        "  tasks_failed     1",
        "  tasks_remaining  0",
        "tasks (2):",
        "  successful       1",
        "  failed           1",
        "failed tasks:",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in\n{stdout}");
    }
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("  bad ") && l.ends_with("HTTP 404")),
        "{stdout}"
    );
}

#[tokio::test]
async fn requeue_failed_reopens_the_run_and_draining_completes_it_again() {
    // Arrange: "bad" failed on its last attempt while its site was down (503, a flaky page
    // that now recovers); the run completed with one failure.
    let (stack, site) = (Stack::new().await, Site::start().await);
    run_with_one_failure(&stack, &site, "/flaky/bad", MAX_ATTEMPTS).await;
    let queue = Queue::create(&stack, 12).await;
    let requeue = requeue_failed(&queue.url);

    // Act
    let first = succeeded(&ops(&stack, &requeue).await);
    let again = succeeded(&ops(&stack, &requeue).await);

    // Assert: the task and the run's counters moved back together, once; one message sent.
    assert!(
        first.contains("1 failed task set back to pending, 1 message sent"),
        "{first}"
    );
    assert!(
        again.contains("0 failed tasks set back to pending, 0 messages sent"),
        "{again}"
    );
    let task = stack.task("bad").await;
    assert_eq!(task.status(), Some("pending"));
    assert_eq!(task.s("error"), None);
    assert_eq!(task.n("attempts"), Some(0), "a fresh set of tries");
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("running"));
    assert_eq!(
        (run.n("tasks_failed"), run.n("tasks_remaining")),
        (Some(0), Some(1))
    );
    assert_eq!(queue.depth(&stack).await, 1);

    // Act: drain the queue with the worker.
    poll_until_drained(&stack, &queue.url).await;

    // Assert: the task succeeded this time, and the run completed a second time.
    assert_eq!(stack.task("bad").await.status(), Some("successful"));
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("tasks_succeeded"), Some(2));
    assert_eq!(
        (run.n("tasks_failed"), run.n("tasks_remaining")),
        (Some(0), Some(0))
    );
    assert_eq!(run.n("times_completed"), Some(2));
}

#[tokio::test]
async fn requeue_waits_out_a_transaction_on_the_run_instead_of_skipping_the_task() {
    // Arrange: a failed task (its dead lease still on it); the run item is held by
    // transactions in flight as the re-queue starts, as when the run's other tasks finish.
    let (stack, site) = (Stack::new().await, Site::start().await);
    run_with_one_failure(&stack, &site, "/status/404", 1).await;
    stack
        .put_task("bad", &site.url("/status/404"), "failed")
        .await;
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(600);
    stack.set_lease("bad", "a-dead-delivery", later).await;
    let queue = Queue::create(&stack, 12).await;
    stack.conflict_on_run(JOB, RUN, 3).await;

    // Act: through the production-like layer.
    let out = Command::new(ops_binary())
        .args(requeue_failed(&queue.url))
        .envs(scenario::ops_env(&stack))
        .env("AWS_ENDPOINT_URL", prodlike_endpoint())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run conveyor-ops");

    // Assert
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("1 failed task set back to pending"),
        "{stdout}"
    );
    let task = stack.task("bad").await;
    assert_eq!(task.status(), Some("pending"));
    assert!(task.s("lease_owner").is_none(), "the dead lease is cleared");
    assert_eq!(stack.run_item(JOB, RUN).await.n("tasks_failed"), Some(0));
    assert_eq!(stack.layer_count("transaction_conflicts").await, 3);
}

#[tokio::test]
async fn requeue_leaves_a_cancelled_run_alone() {
    // Arrange
    let (stack, site) = (Stack::new().await, Site::start().await);
    run_with_one_failure(&stack, &site, "/status/404", 1).await;
    stack.put_run(JOB, RUN, "cancelled").await;
    let queue = Queue::create(&stack, 12).await;

    // Act
    let args = requeue_failed(&queue.url);
    let out = ops(&stack, &args).await;

    // Assert
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cancelled"));
    assert_eq!(stack.task("bad").await.status(), Some("failed"));
    assert_eq!(queue.depth(&stack).await, 0);
}

#[tokio::test]
async fn replay_quarantine_sends_each_poison_body_back_and_deletes_it() {
    // Arrange: two poison messages quarantined by the worker.
    let stack = Stack::new().await;
    let bodies = [r#"{"job_id": "j1"}"#, "not json"];
    let records = vec![record("p1", bodies[0], 1), record("p2", bodies[1], 1)];
    assert!(retried(&run_batch(&stack.worker(), records).await).is_empty());
    let queue = Queue::create(&stack, 30).await;

    // Act: the replayed messages held 4 s (production's 10, shrunk; a loaded machine may
    // take a second or two between the tool's send and the test's receive).
    let args = [
        "replay-quarantine",
        "--queue-url",
        &queue.url,
        "--delete",
        "--hold",
        "4s",
    ];
    let stdout = succeeded(&ops(&stack, &args).await);
    let at_once = queue.receive(&stack).await;
    tokio::time::sleep(Duration::from_millis(4_100)).await;

    // Assert: each original body is back on the queue once the quarantine is empty.
    assert!(
        stdout.contains("2 messages replayed, 2 deleted, 0 skipped"),
        "{stdout}"
    );
    assert!(at_once.is_none(), "held until the objects were deleted");
    let mut replayed = Vec::new();
    while let Some(message) = queue.receive(&stack).await {
        replayed.push(message.body.expect("a body"));
    }
    replayed.sort();
    assert_eq!(replayed, ["not json", r#"{"job_id": "j1"}"#]);
    assert_eq!(quarantined(&stack).await, 0);
}

/// The objects under the quarantine prefix.
pub(crate) async fn quarantined(stack: &Stack) -> i32 {
    let listed = stack
        .s3
        .list_objects_v2()
        .bucket(&stack.bucket)
        .prefix("quarantine/")
        .send()
        .await
        .expect("list the quarantine");
    listed.key_count().unwrap_or(0)
}

/// `progress` of a run that no emulator answers for, with these variables removed: what it
/// printed on its standard error.
async fn failing_progress(remove: &[&str]) -> String {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let mut command = Command::new(ops_binary());
    command
        .args(["progress", "--table", "t", "--job", JOB, "--run", RUN])
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{closed_port}"),
        )
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .kill_on_drop(true);
    for name in remove {
        command.env_remove(name);
    }
    let out = command.output().await.expect("run conveyor-ops");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn an_operator_error_says_its_cause() {
    let dead_endpoint = failing_progress(&[]).await;
    let no_region = failing_progress(&["AWS_REGION", "AWS_DEFAULT_REGION"]).await;
    let no_credentials = failing_progress(&["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]).await;

    assert!(
        dead_endpoint.contains("Connection refused"),
        "{dead_endpoint}"
    );
    assert!(no_region.contains("missing signing region"), "{no_region}");
    assert!(
        no_credentials.contains("no credentials"),
        "{no_credentials}"
    );
}

#[tokio::test]
async fn poll_refuses_a_timeout_within_the_deadline_margin() {
    let stack = Stack::new().await;
    let queue = Queue::create(&stack, 30).await;

    let args = ["poll", "--queue-url", &queue.url, "--timeout", "2s"];
    let out = ops(&stack, &args).await;

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("leaves no time"), "{stderr}");
}

#[tokio::test]
async fn requeue_in_a_sharded_run_reopens_its_shard_and_draining_completes_the_run_again() {
    // Arrange: a run counted in two shards in one group; "bad" failed on its last attempt
    // while its site was down, and the run completed.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    stack
        .put_sharded_run((JOB, RUN), &["fine".into(), "bad".into()], (2, 1))
        .await;
    stack
        .put_task("fine", &site.url("/page/fine"), "pending")
        .await;
    stack
        .put_task("bad", &site.url("/flaky/bad"), "pending")
        .await;
    let records = vec![delivery("fine"), record("bad", &body("bad"), MAX_ATTEMPTS)];
    run_batch(&stack.worker(), records).await;
    assert_eq!(stack.run_item(JOB, RUN).await.status(), Some("completed"));
    let queue = Queue::create(&stack, 12).await;

    // Act
    let requeued = succeeded(&ops(&stack, &requeue_failed(&queue.url)).await);
    let progress = succeeded(&ops(&stack, &["progress", "--job", JOB, "--run", RUN]).await);
    let reopened = stack.run_item(JOB, RUN).await;
    poll_until_drained(&stack, &queue.url).await;

    // Assert: reopened with its shard and group, then completed a second time; progress
    // sums shards.
    assert!(
        requeued.contains("1 failed task set back to pending"),
        "{requeued}"
    );
    assert_eq!(reopened.status(), Some("running"));
    assert_eq!(reopened.n("groups_remaining"), Some(1));
    assert!(progress.contains("tasks_remaining  1"), "{progress}");
    assert!(progress.contains("tasks_failed     0"), "{progress}");
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("times_completed"), Some(2));
    assert_eq!(stack.run_counters(JOB, RUN).await, (2, 0, 0));
    assert_eq!(
        stack.counter_tree_faults(JOB, RUN).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_requeue_stopped_by_an_error_has_sent_a_message_for_every_task_it_reset() {
    // Arrange: 30 tasks that failed for good, counted in 3 shards; the item of a shard that
    // t00 is not in is gone, so the re-queue meets an error after it reset t00 at least.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    let ids: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    stack.put_sharded_run((JOB, RUN), &ids, (3, 0)).await;
    for id in &ids {
        stack
            .put_task(id, &site.url(&format!("/gone/{id}")), "pending")
            .await;
    }
    let reply = run_batch(&stack.worker(), ids.iter().map(|id| delivery(id)).collect()).await;
    assert!(retried(&reply).is_empty());
    let sharding = conveyor_worker::domain::model::Sharding {
        shards: 3,
        groups: 0,
    };
    let shard = |task: &str| sharding.shard_of(&id(task));
    let lost = (0..3).find(|s| *s != shard("t00")).expect("another shard");
    let (job, run) = (id(JOB), id(RUN));
    stack
        .dynamodb
        .delete_item()
        .table_name(&stack.table)
        .set_key(Some(keys::shard_key(&job, &run, lost)))
        .send()
        .await
        .expect("delete a shard");
    let queue = Queue::create(&stack, 60).await;

    // Act
    let out = ops(&stack, &requeue_failed(&queue.url)).await;

    // Assert: it says it stopped; each task it set back to pending has its message.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let mut pending = 0;
    for id in &ids {
        pending += u64::from(stack.task(id).await.status() == Some("pending"));
    }
    assert!(pending >= 1, "t00 was reset");
    assert_eq!(queue.depth(&stack).await, pending, "{stdout}");
}

/// Milliseconds since the Unix epoch, as the host items keep their times.
fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

/// A host's items as the worker writes them when its schedule is booked a minute ahead by
/// the test run, it pushed back (a cooldown of 30 s, a slowdown of 4 with a knee of 2), one
/// fetch is in flight and one slot lapsed; its robots.txt is `robots` for 10 more minutes,
/// and a sandbox holds the lease on its next fetch.
async fn troubled_host(stack: &Stack, host: &str, robots: &str) {
    let now = now_ms();
    let mut schedule = keys::host_key(host, "HOST");
    for (name, value) in [
        ("next_start", now + 60_000),
        ("tail_from", now - 1_000),
        ("tail_until", now + 60_000),
        ("cooldown_until", now + 30_000),
        ("slowdown_at", now),
        ("slot_0", now + 20_000),
        ("slot_1", now - 5_000),
        ("touched_at", now - 3_000),
    ] {
        schedule.insert(name.into(), attributes::n(value));
    }
    for (name, value) in [("slowdown", 4.0), ("slowdown_knee", 2.0)] {
        schedule.insert(name.into(), attributes::n(value));
    }
    schedule.insert("answer_ms".into(), attributes::n(120.5));
    schedule.insert("floor_ms".into(), attributes::n(80.0));
    schedule.insert("tail_run".into(), attributes::s(&format!("{JOB}/{RUN}")));
    stack.put_item(schedule).await;
    let mut kept = keys::host_key(host, "ROBOTS");
    kept.insert("status".into(), attributes::s(robots));
    kept.insert("expires_at".into(), attributes::n(now + 600_000));
    kept.insert("lease_until".into(), attributes::n(now + 20_000));
    stack.put_item(kept).await;
}

#[tokio::test]
async fn host_show_says_the_booked_schedule_the_cooldown_the_slots_and_robots_txt() {
    // Arrange: the host of https://Show.Example/, keyed `show.example:443`.
    let stack = Stack::new().await;
    troubled_host(&stack, "show.example:443", "allow_all").await;
    let url = "https://Show.Example./a/page";

    // Act
    let text = succeeded(&ops(&stack, &["host", "show", url]).await);
    let json = succeeded(&ops(&stack, &["host", "show", "show.example:443", "--json"]).await);

    // Assert
    let has = |start: &str, part: &str| {
        let line = text.lines().find(|l| l.trim_start().starts_with(start));
        assert!(
            line.is_some_and(|l| l.contains(part)),
            "{start}: {part:?}\n{text}"
        );
    };
    assert!(text.starts_with("host show.example:443\n"), "{text}");
    has("next start", "booked that far ahead");
    has("tail", &format!("run {JOB}/{RUN} booked from "));
    has("slowdown", "x4.00 set ");
    has("slowdown", "knee x2.00");
    has("cooldown", " left");
    has("in-flight slots", "1 held: slot 0 until in ");
    has("in-flight slots", "(1 lapsed, free)");
    has("answer time", "120.5 ms on average, floor 80.0 ms");
    has("status", "allow_all");
    has("expires", "in ");
    has("fetch lease", "a sandbox is fetching it");
    let json: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
    let ahead = json["schedule"]["booked_ahead_ms"].as_u64().expect("ms");
    assert!((50_000..=60_000).contains(&ahead), "{json}");
    let left = json["schedule"]["cooldown_left_ms"].as_u64().expect("ms");
    assert!((20_000..=30_000).contains(&left), "{json}");
    assert_eq!(json["schedule"]["slots_held"][0]["index"], 0, "{json}");
    assert_eq!(json["robots"]["status"], "allow_all", "{json}");
}

#[tokio::test]
async fn host_reset_clears_the_schedule_and_robots_txt_and_the_next_fetch_starts_at_once() {
    // Arrange: a host cooling down, booked a minute ahead, a slot held, robots.txt
    // unavailable (every path disallowed) for 10 minutes.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let host = site.url("").trim_start_matches("http://").to_owned();
    troubled_host(&stack, &host, "unavailable").await;
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/t1"), "pending").await;
    let worker = stack.worker_with(|t| {
        t.politeness = crate::polite_defaults::production_defaults();
    });

    // Act
    let url = site.url("/page/t1");
    let out = succeeded(&ops(&stack, &["host", "reset", &url, "--robots"]).await);
    let cleared = stack.host_item(&host, "HOST").await;
    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    // Assert: what was cleared is said; the task was fetched on this delivery.
    for part in [
        "next start",
        "tail",
        "slowdown",
        "cooldown",
        "in-flight slots",
    ] {
        assert!(out.contains(part), "{part}: {out}");
    }
    assert!(out.contains("deleted (unavailable)"), "{out}");
    for name in [
        "next_start",
        "cooldown_until",
        "slowdown",
        "tail_run",
        "slot_0",
    ] {
        assert_eq!(cleared.0.get(name), None, "{name} is still set");
    }
    let answers = cleared.0.get("answer_ms").and_then(|a| a.as_n().ok());
    assert_eq!(
        answers.map(String::as_str),
        Some("120.5"),
        "answer times are kept"
    );
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(site.hits("/page/t1"), 1);
    let robots = stack.host_item(&host, "ROBOTS").await;
    assert_eq!(robots.s("status"), Some("allow_all"), "fetched again (404)");
}

#[tokio::test]
async fn a_host_without_items_is_refused_as_bad_input_and_nothing_is_written() {
    // Arrange
    let stack = Stack::new().await;

    // Act
    let shown = ops(&stack, &["host", "show", "nobody.example:443"]).await;
    let reset = ops(&stack, &["host", "reset", "nobody.example:443", "--robots"]).await;

    // Assert
    for out in [&shown, &reset] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("host nobody.example:443 has no "),
            "{stderr}"
        );
    }
    assert!(
        stack
            .host_item("nobody.example:443", "HOST")
            .await
            .0
            .is_empty()
    );
}

#[tokio::test]
async fn after_a_host_reset_a_start_booked_before_it_takes_a_turn_of_the_new_schedule() {
    // Arrange: the troubled host, for a job at 1 a second; a copy of a task parked before
    // the reset, for a start 1.5 s from now.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let host = site.url("").trim_start_matches("http://").to_owned();
    troubled_host(&stack, &host, "allow_all").await;
    stack.put_polite_job(JOB, 1.0).await;
    stack.put_counted_run(JOB, RUN, 10).await;
    stack.put_task("t1", &site.url("/page/t1"), "pending").await;
    let start = now_ms() + 1_500;
    let parked = format!(
        r#"{{"job_id":"{JOB}","run_id":"{RUN}","task_id":"t1","polite_start":{start},"polite_waits":1,"copied_at":{}}}"#,
        now_ms() - 1_000
    );
    let worker = stack.worker_with(|t| {
        t.politeness = crate::polite_defaults::production_defaults();
    });

    // Act
    succeeded(&ops(&stack, &["host", "reset", &host]).await);
    let reply = run_batch(&worker, vec![record("m1", &parked, 1)]).await;

    // Assert: fetched, on a turn of the cleared schedule, which it moved on (a booked start
    // kept would have taken its slot alone).
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    let next = stack.host_item(&host, "HOST").await.n("next_start");
    assert!(next.is_some_and(|next| next > start), "{next:?}");
}
