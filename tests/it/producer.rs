//! The producer's half of the operator's tool against the emulator: `submit` turns a list of
//! URLs into a run (and survives being killed half-way), `progress --watch` follows it to
//! its end, `results` lists, checks and downloads what it stored.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::ops::{ops, poll_until_drained, succeeded};

/// A list file with these lines; its path.
fn list(lines: &[String]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(unique("urls"));
    std::fs::write(&path, lines.join("\n")).expect("write the list");
    path
}

fn submit_args<'a>(queue: &'a Queue, list: &'a std::path::Path) -> Vec<&'a str> {
    let list = list.to_str().expect("a UTF-8 path");
    let run = ["submit", "--job", JOB, "--run", RUN];
    let mut args = run.to_vec();
    args.extend(["--queue-url", queue.url.as_str(), "--urls", list]);
    args
}

#[tokio::test]
async fn a_list_with_a_bad_line_is_refused_with_its_number_and_nothing_is_written() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    let file = list(&[
        site.url("/page/a"),
        "ftp://example.com/x".into(),
        site.url("/page/b"),
    ]);

    let out = ops(&stack, &submit_args(&queue, &file)).await;

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2: scheme \"ftp\""), "{stderr}");
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert!(stack.run_item(JOB, RUN).await.0.is_empty());
    assert_eq!(queue.depth(&stack).await, 0);
}

#[tokio::test]
async fn skipping_invalid_lines_submits_the_rest_as_a_counted_run() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    let file = list(&[site.url("/page/a"), "not a url".into(), site.url("/page/b")]);
    let mut args = submit_args(&queue, &file);
    args.push("--skip-invalid");

    let stdout = succeeded(&ops(&stack, &args).await);

    assert!(
        stdout.contains("2 tasks, 2 created, 2 messages sent"),
        "{stdout}"
    );
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(
        (run.status(), run.n("tasks_total")),
        (Some("running"), Some(2))
    );
    assert_eq!(run.n("tasks_remaining"), Some(2));
    assert_eq!(
        stack.task("t000001").await.s("url"),
        Some(site.url("/page/a").as_str())
    );
    assert_eq!(stack.task("t000003").await.status(), Some("pending"));
    assert_eq!(queue.depth(&stack).await, 2);
}

const LIST: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_killed_half_way_and_run_again_ends_with_every_task_once() {
    // Arrange: a list of 500 URLs, and a submit killed once its first 100 are sent.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 600).await;
    let urls: Vec<String> = (0..LIST)
        .map(|i| site.url(&format!("/page/p{i}")))
        .collect();
    let file = list(&urls);
    let mut args = submit_args(&queue, &file);
    args.extend(["--progress-every", "0s"]);
    let mut first = Command::new(ops_binary())
        .args(&args)
        .envs(scenario::ops_env(&stack))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start a submit");
    let mut lines = BufReader::new(first.stdout.take().expect("stdout")).lines();
    while let Some(line) = lines.next_line().await.expect("read the progress") {
        if line.starts_with("100/") {
            break;
        }
    }
    first.kill().await.expect("kill the submit");

    // Act
    let stdout = succeeded(&ops(&stack, &args).await);

    // Assert: every task once, the counters exact, every task's message sent (a chunk of
    // duplicates at most).
    assert!(stdout.contains("resumed after the first"), "{stdout}");
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("tasks_total"), Some(LIST as u64));
    assert_eq!(
        (run.n("counter_shards"), run.n("counter_groups")),
        (Some(32), None),
        "the default for 500 tasks"
    );
    assert_eq!(stack.run_counters(JOB, RUN).await, (0, 0, LIST as u64));
    let tasks = stack.tasks_in_run(JOB, RUN).await;
    assert_eq!(tasks.len(), LIST);
    assert!(tasks.iter().all(|(_, t)| t.status() == Some("pending")));
    let messages = queue.drain(&stack).await;
    let named: HashSet<String> = messages.iter().filter_map(|m| m.body.clone()).collect();
    assert_eq!(named.len(), LIST, "every task has its message");
    assert!(messages.len() <= LIST + 100, "{} messages", messages.len());
}

#[tokio::test]
async fn a_submitted_counter_tree_adds_up_and_a_resumed_submit_keeps_it() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 60).await;
    let urls: Vec<String> = (0..40).map(|i| site.url(&format!("/page/p{i}"))).collect();
    let file = list(&urls);
    let mut first = submit_args(&queue, &file);
    first.extend(["--counter-shards", "8", "--counter-groups", "3"]);
    let mut again = submit_args(&queue, &file);
    again.extend(["--counter-shards", "5"]);

    succeeded(&ops(&stack, &first).await);
    succeeded(&ops(&stack, &again).await);
    let submitted = stack.run_item(JOB, RUN).await;
    let tree = stack.counter_tree_faults(JOB, RUN).await;
    poll_until_drained(&stack, &queue.url).await;

    let counters = |run: &TaskItem| (run.n("counter_shards"), run.n("counter_groups"));
    assert_eq!(
        counters(&submitted),
        (Some(8), Some(3)),
        "the first submit's"
    );
    assert_eq!(submitted.n("groups_remaining"), Some(3));
    assert_eq!(tree, Vec::<String>::new());
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("times_completed"), Some(1));
    assert_eq!(stack.run_counters(JOB, RUN).await, (40, 0, 0));
}

#[tokio::test]
async fn a_large_run_is_submitted_spread_over_its_shards_and_drains_to_one_completion() {
    // Arrange: 150 URLs, the default layout (a shard per 16 tasks: 10; spread, v3).
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 60).await;
    let urls: Vec<String> = (0..150).map(|i| site.url(&format!("/page/p{i}"))).collect();
    let file = list(&urls);

    // Act
    succeeded(&ops(&stack, &submit_args(&queue, &file)).await);
    let submitted = stack.run_item(JOB, RUN).await;
    let message = queue.receive(&stack).await.expect("a task's message");
    let handle = message.receipt_handle.clone().unwrap_or_default();
    let visible_again = stack.sqs.change_message_visibility().queue_url(&queue.url);
    let visible_again = visible_again.receipt_handle(handle).visibility_timeout(0);
    visible_again
        .send()
        .await
        .expect("the message back on the queue");
    poll_until_drained(&stack, &queue.url).await;
    let results = ops(&stack, &["results", "--job", JOB, "--run", RUN]).await;

    // Assert: v3 on the run and in each message; tasks under their shards' partitions; the
    // run completed once and every stored page checks out.
    assert_eq!(submitted.n("counter_shards"), Some(10));
    assert_eq!(submitted.n("task_shards"), Some(10));
    let body = message.body.unwrap_or_default();
    assert!(body.contains(r#""task_shards":10"#), "{body}");
    let listed = stack.tasks_in_run(JOB, RUN).await;
    let partitions: HashSet<String> = listed
        .iter()
        .filter_map(|(_, t)| t.s("pk").map(str::to_owned))
        .collect();
    assert_eq!((listed.len(), partitions.len()), (150, 10));
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(
        (run.status(), run.n("times_completed")),
        (Some("completed"), Some(1))
    );
    assert_eq!(stack.run_counters(JOB, RUN).await, (150, 0, 0));
    let checked = succeeded(&results);
    assert!(!checked.contains("mismatch"), "{checked}");
}

/// A submitted run of two fine pages and a gone one, drained by the worker.
async fn finished_run(stack: &Stack, site: &Site) -> Queue {
    let queue = Queue::create(stack, 30).await;
    let file = list(&[
        site.url("/page/a"),
        site.url("/gone/b"),
        site.url("/page/c"),
    ]);
    succeeded(&ops(stack, &submit_args(&queue, &file)).await);
    poll_until_drained(stack, &queue.url).await;
    queue
}

#[tokio::test]
async fn results_list_each_task_with_its_object_checked_against_its_record() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    finished_run(&stack, &site).await;
    let results = ["results", "--job", JOB, "--run", RUN];

    let json = succeeded(&ops(&stack, &[&results[..], &["--json"]].concat()).await);
    let failed = succeeded(&ops(&stack, &[&results[..], &["--failed"]].concat()).await);

    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let statuses: Vec<&str> = lines.iter().filter_map(|l| l["status"].as_str()).collect();
    assert_eq!(statuses, ["successful", "failed", "successful"]);
    assert_eq!(lines[0]["check"], "verified");
    assert_eq!(lines[0]["url"], site.url("/page/a"));
    assert_eq!(lines[1]["error"], "HTTP 404");
    assert_eq!(failed.lines().count(), 1, "{failed}");
    assert!(
        failed.contains("t000002") && failed.contains("HTTP 404"),
        "{failed}"
    );
}

#[tokio::test]
async fn downloaded_results_are_the_stored_bytes_and_a_tampered_object_is_reported() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    finished_run(&stack, &site).await;
    let out = std::env::temp_dir().join(unique("results"));
    let out_arg = out.to_str().expect("a UTF-8 path");
    let download = ["results", "--job", JOB, "--run", RUN, "--out", out_arg];

    succeeded(&ops(&stack, &download).await);
    let key = format!("{PREFIX}{JOB}/{RUN}/t000003");
    stack.put_object(&key, b"not what was fetched", 200).await;
    let tampered = ops(&stack, &["results", "--job", JOB, "--run", RUN]).await;
    let bytes = std::fs::read(out.join("t000001")).expect("downloaded");
    let key = format!("{PREFIX}{JOB}/{RUN}/t000001");
    stack
        .s3
        .delete_object()
        .bucket(&stack.bucket)
        .key(&key)
        .send()
        .await
        .expect("delete an object");
    let missing = ops(&stack, &download).await;

    assert_eq!(bytes, b"<html><body>page a</body></html>");
    assert!(!out.join("t000002").exists(), "a failed task has no object");
    assert_eq!(tampered.status.code(), Some(1));
    assert_eq!(missing.status.code(), Some(1));
    let listed = String::from_utf8_lossy(&missing.stdout);
    assert!(
        listed.contains(&format!("MISMATCH: no object at {key}")),
        "{listed}"
    );
    let stdout = String::from_utf8_lossy(&tampered.stdout);
    assert!(
        stdout.contains("t000003") && stdout.contains("MISMATCH"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_watch_follows_a_run_until_it_completes() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    let file = list(&[site.url("/page/a"), site.url("/slowpage/b")]);
    succeeded(&ops(&stack, &submit_args(&queue, &file)).await);
    let watch = [
        "progress", "--job", JOB, "--run", RUN, "--watch", "--every", "200ms",
    ];

    let (watched, _) = tokio::join!(ops(&stack, &watch), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        poll_until_drained(&stack, &queue.url).await
    });

    let stdout = succeeded(&watched);
    assert!(stdout.contains("0/2 tasks ended"), "{stdout}");
    assert!(stdout.contains("2/2 tasks ended"), "{stdout}");
    assert!(stdout.contains("status           completed"), "{stdout}");
}
