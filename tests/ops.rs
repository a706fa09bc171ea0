//! The operator's tool against the emulator: `conveyor-ops poll` drains a queue the way
//! Lambda's event source mapping would, with the worker configured from the environment.

mod support;

use std::process::Stdio;

use conveyor_worker::config::DuplicatePolicy;
use support::scenario;
use tokio::process::Command;

const TASKS: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_until_drained_ends_every_task_of_a_run_exactly_once() {
    // Arrange: a counted run over fine, flaky, gone, slow and dead pages, some messages
    // sent three times.
    let prepared = scenario::prepare(TASKS, DuplicatePolicy::Converge).await;

    // Act
    let out = Command::new(env!("CARGO_BIN_EXE_conveyor-ops"))
        .args([
            "poll",
            "--queue-url",
            &prepared.queue.url,
            "--until-drained",
        ])
        .args(["--limit", "2m", "--timeout", "10s", "--wait-seconds", "1"])
        .args(["--progress-every", "1s"])
        .envs(scenario::worker_env(&prepared.stack))
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
        stdout.lines().any(|l| l.starts_with("drained: ")),
        "{stdout}"
    );
    assert!(stdout.contains(" queued "), "progress lines: {stdout}");
    let report = prepared.check(None, 0.0, "").await;
    assert_eq!(
        report.successful + report.failed,
        TASKS,
        "{}",
        report.line()
    );
    assert_eq!(report.dead_lettered, 0, "{}", report.line());
    assert!(
        report.counters.starts_with("run completed:"),
        "{}",
        report.counters
    );
}

#[tokio::test]
async fn poll_refuses_to_start_without_the_worker_settings() {
    // Arrange: no TABLE_NAME or RESULTS_BUCKET.
    let mut command = Command::new(env!("CARGO_BIN_EXE_conveyor-ops"));
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
