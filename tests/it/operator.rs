//! `conveyor-ops` as a user runs it, a process against the emulator: the exit code a script
//! branches on, the summary a person reads, a stall named, a changed list refused, errors
//! that name the resource, a pipe closed early, the quarantine and the dead letters.

use std::process::{Output, Stdio};
use std::time::Duration;

use aws_sdk_sqs::types::MessageAttributeValue;
use conveyor_ops::redrive;
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::domain::message::{Carried, Message, parse_body};
use conveyor_worker::store::sqs::SqsQueue;
use tokio::process::Command;

use crate::ops::{list, ops, ops_command, quarantined, succeeded};

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn submit(stack: &Stack, queue: &Queue, file: &str) -> Output {
    let args = [
        "submit",
        "--job",
        JOB,
        "--run",
        RUN,
        "--queue-url",
        &queue.url,
        "--urls",
        file,
    ];
    ops(stack, &args).await
}

#[tokio::test]
async fn a_changed_list_for_an_existing_run_is_refused_naming_its_first_differing_line() {
    // Arrange: a run of three pages submitted whole.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    let pages = |names: [&str; 3]| names.map(|n| site.url(&format!("/page/{n}"))).to_vec();
    succeeded(&submit(&stack, &queue, &list(&pages(["a", "b", "c"]))).await);

    // Act: the same length, the second line changed; then the same list again.
    let changed = submit(&stack, &queue, &list(&pages(["a", "x", "c"]))).await;
    let same = submit(&stack, &queue, &list(&pages(["a", "b", "c"]))).await;

    // Assert
    assert_eq!(code(&changed), Some(2), "{}", stderr(&changed));
    assert!(stderr(&changed).contains("line 2"), "{}", stderr(&changed));
    assert!(
        stderr(&changed).contains("another URL"),
        "{}",
        stderr(&changed)
    );
    assert!(stdout(&succeeded_ok(&same)).contains("0 messages sent"));
}

fn succeeded_ok(out: &Output) -> Output {
    succeeded(out);
    out.clone()
}

#[tokio::test]
async fn poll_exits_4_when_a_message_went_to_the_dead_letter_queue_and_says_so_in_its_summary() {
    // Arrange: a task whose page is down, on a queue that gives up after one receive.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/down/a"), "pending").await;
    let dlq = Queue::create(&stack, 30).await;
    let queue = Queue::create_with_dlq(&stack, 1, &dlq, 1).await;
    queue.send(&stack, &body("t1")).await;

    // Act
    let args = [
        "poll",
        "--queue-url",
        &queue.url,
        "--until-drained",
        "--limit",
        "1m",
        "-q",
    ];
    let out = ops(&stack, &args).await;

    // Assert: the summary alone (quiet), then the dead-lettered code.
    assert_eq!(code(&out), Some(4), "{}", stderr(&out));
    let printed = stdout(&out);
    assert_eq!(printed.lines().count(), 1, "{printed}");
    assert!(
        printed.contains("drained after") && printed.contains("1 moved to the dead-letter queue"),
        "{printed}"
    );
    assert!(
        stderr(&out).contains("conveyor-ops redrive"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn poll_gives_up_with_exit_5_and_one_line_when_sqs_stays_out_of_reach() {
    // Arrange: the emulator's queue, then an endpoint nothing listens on.
    let stack = Stack::new().await;
    let queue = Queue::create(&stack, 30).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("an address"));
    drop(closed);

    // Act
    let args = [
        "poll",
        "--queue-url",
        &queue.url,
        "--give-up-after",
        "3s",
        "--wait-seconds",
        "0",
    ];
    let out = ops_with(&stack, &args, ("AWS_ENDPOINT_URL", &endpoint)).await;

    // Assert: exit 5, the queue named once, not a warning per failed call.
    let text = stderr(&out);
    assert_eq!(code(&out), Some(5), "{text}");
    assert!(text.contains(&queue.url), "{text}");
    assert!(text.lines().count() < 10, "{text}");
}

/// `conveyor-ops` started as a child process (stdout and stderr piped), to act on while it
/// runs.
fn spawn_ops(stack: &Stack, args: &[&str]) -> tokio::process::Child {
    ops_command(stack, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run conveyor-ops")
}

/// `task`'s message, delivered in a minute (as a politeness hold or a backoff keeps it).
async fn send_later(stack: &Stack, queue: &Queue, task: &str) {
    stack
        .sqs
        .send_message()
        .queue_url(&queue.url)
        .message_body(body(task))
        .delay_seconds(60)
        .send()
        .await
        .expect("send a delayed message");
}

/// Its output, once it ends (within a minute).
async fn ended(child: tokio::process::Child) -> Output {
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("it ends within a minute")
        .expect("its output")
}

#[tokio::test]
async fn poll_gives_up_after_its_stretch_of_failing_sqs_calls_with_one_line() {
    // Arrange: a poll under way, then its queue deleted (every SQS call fails from then).
    let stack = Stack::new().await;
    let queue = Queue::create(&stack, 30).await;
    let args = [
        "poll",
        "--queue-url",
        &queue.url,
        "--give-up-after",
        "2s",
        "--wait-seconds",
        "0",
        "-q",
    ];
    let child = spawn_ops(&stack, &args);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // Act
    let queue_url = queue.url.clone();
    stack
        .sqs
        .delete_queue()
        .queue_url(&queue_url)
        .send()
        .await
        .expect("delete the queue");
    let out = ended(child).await;

    // Assert: exit 5 after the stretch, the queue and the failure said once; the summary.
    let text = stderr(&out);
    assert_eq!(code(&out), Some(5), "{text}");
    assert!(
        text.contains(&format!("queue {queue_url}: every SQS call failed for")),
        "{text}"
    );
    assert!(text.lines().count() < 6, "{text}");
    assert!(
        stdout(&out).starts_with("SQS out of reach after"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn poll_until_drained_stopped_by_ctrl_c_before_it_drained_exits_3() {
    // Arrange: a message that waits a minute in the queue.
    let stack = Stack::new().await;
    let queue = Queue::create(&stack, 30).await;
    send_later(&stack, &queue, "t1").await;
    let args = ["poll", "--queue-url", &queue.url, "--until-drained", "-q"];
    let child = spawn_ops(&stack, &args);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // Act: Ctrl-C.
    let pid = child.id().expect("a running child").to_string();
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill");
    let out = ended(child).await;

    // Assert
    assert!(interrupted.success());
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stopped before the queue drained"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn a_run_waiting_in_the_queue_is_not_called_stalled_and_a_cancelled_run_ends_the_watch_with_1()
 {
    // Arrange: a run whose one task's message waits a minute in the queue (as a politeness
    // hold does); a watch that looks at the queue and one that cannot.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 1).await;
    stack
        .put_task("held", &site.url("/page/a"), "pending")
        .await;
    send_later(&stack, &queue, "held").await;
    let watch = |queue_url: Option<&str>| {
        let mut args = vec![
            "progress",
            "--job",
            JOB,
            "--run",
            RUN,
            "--watch",
            "--every",
            "200ms",
            "--stall-after",
            "1s",
        ];
        args.extend(
            queue_url
                .map(|url| ["--queue-url", url])
                .into_iter()
                .flatten(),
        );
        spawn_ops(&stack, &args)
    };
    let (looking, blind) = (watch(Some(&queue.url)), watch(None));

    // Act: three stall periods (production's 2 minutes, shrunk), then the run cancelled.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack.put_run(JOB, RUN, "cancelled").await;
    let (looking, blind) = (ended(looking).await, ended(blind).await);

    // Assert: neither called it stalled; the blind one said why it could not tell; both
    // ended with the failed code once the run was cancelled.
    for out in [&looking, &blind] {
        let text = stderr(out);
        assert_eq!(code(out), Some(1), "{text}");
        assert!(!text.contains("stalled"), "{text}");
        assert!(text.contains("ended cancelled"), "{text}");
    }
    assert!(
        stderr(&blind).contains("without --queue-url"),
        "{}",
        stderr(&blind)
    );
    assert!(!stderr(&looking).contains("note:"), "{}", stderr(&looking));
}

#[tokio::test]
async fn a_longer_list_or_a_change_past_the_first_hundred_lines_is_refused_naming_its_line() {
    // Arrange: a run of 150 pages submitted whole (its tasks read back 100 at a time).
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    let pages: Vec<String> = (0..150).map(|i| site.url(&format!("/page/p{i}"))).collect();
    succeeded(&submit(&stack, &queue, &list(&pages)).await);

    // Act
    let mut changed = pages.clone();
    changed[129] = site.url("/page/changed");
    let changed = submit(&stack, &queue, &list(&changed)).await;
    let longer = [pages.clone(), vec![site.url("/page/more")]].concat();
    let longer = submit(&stack, &queue, &list(&longer)).await;
    let shorter = submit(&stack, &queue, &list(&pages[..149])).await;

    // Assert
    for (out, said) in [
        (&changed, "line 130: task t000130 exists with another URL"),
        (&longer, "line 151: this list has 151 URLs"),
        (&shorter, "line 149: this list ends with 149 URLs"),
    ] {
        assert_eq!(code(out), Some(2), "{}", stderr(out));
        assert!(stderr(out).contains(said), "{}", stderr(out));
    }
}

#[tokio::test]
async fn results_exit_3_while_tasks_have_not_ended_and_summarise_what_they_are() {
    // Arrange: one task done and stored, one pending.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("done", &site.url("/page/a"), "pending")
        .await;
    stack
        .put_task("open", &site.url("/page/b"), "pending")
        .await;
    run_batch(&stack.worker(), vec![delivery("done")]).await;

    // Act
    let out = ops(&stack, &["results", "--job", JOB, "--run", RUN]).await;

    // Assert
    assert_eq!(code(&out), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("2 tasks: 1 successful, 0 failed, 1 not ended"),
        "{said}"
    );
    assert!(said.contains("1 task not ended yet"), "{said}");
    assert_eq!(stdout(&out).lines().count(), 2, "the tasks alone");
}

#[tokio::test]
async fn progress_watch_names_a_stalled_run_with_what_to_run_and_exits_3() {
    // Arrange: a run whose task is pending with no message anywhere (its send was lost).
    let (stack, site) = (Stack::new().await, Site::start().await);
    let queue = Queue::create(&stack, 30).await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 1).await;
    stack
        .put_task("lost", &site.url("/page/a"), "pending")
        .await;

    // Act: a stall after 1 s (production's 2 minutes, shrunk), the queue looked at.
    let args = [
        "progress",
        "--job",
        JOB,
        "--run",
        RUN,
        "--watch",
        "--every",
        "200ms",
        "--stall-after",
        "1s",
        "--queue-url",
        &queue.url,
    ];
    let out = ops(&stack, &args).await;

    // Assert: the stuck task and the routine that sends it again; no ETA made up.
    let text = stderr(&out);
    assert_eq!(code(&out), Some(3), "{text}");
    assert!(
        text.contains("stalled") && text.contains("lost (pending)"),
        "{text}"
    );
    assert!(text.contains("--resend-open"), "{text}");
    assert!(
        stdout(&out).contains("time left unknown"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn a_reader_that_closes_early_ends_the_output_quietly() {
    // Arrange: a run of 40 tasks to list.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    for i in 0..40 {
        stack
            .put_task(&format!("t{i}"), &site.url("/page/a"), "pending")
            .await;
    }

    // Act: the reader goes before the first line comes (as `| head -1` does once it has
    // its line and more is written than a pipe holds).
    let mut child = spawn_ops(&stack, &["results", "--job", JOB, "--run", RUN]);
    drop(child.stdout.take());
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("it ends")
        .expect("its output");

    // Assert: no panic, no message; the status a shell gives SIGPIPE.
    assert_eq!(stderr(&out), "");
    assert_eq!(code(&out), Some(141));
}

/// `conveyor-ops` with one variable of the stack's set to `value`.
async fn ops_with(stack: &Stack, args: &[&str], (name, value): (&str, &str)) -> Output {
    ops_command(stack, args)
        .env(name, value)
        .output()
        .await
        .expect("run conveyor-ops")
}

#[tokio::test]
async fn a_wrong_table_bucket_or_queue_is_named_with_the_flag_that_sets_it() {
    // Arrange: a run with one page stored.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    run_batch(&stack.worker(), vec![delivery("t1")]).await;
    let run = ["--job", JOB, "--run", RUN];
    let out_dir = std::env::temp_dir().join(unique("results"));
    let out_dir = out_dir.to_str().expect("a UTF-8 path");

    // Act
    let progress = [&["progress"][..], &run].concat();
    let table = ops_with(&stack, &progress, ("TABLE_NAME", "no-such-table")).await;
    let results = [&["results", "--out", out_dir][..], &run].concat();
    let bucket = ops_with(&stack, &results, ("RESULTS_BUCKET", "no-such-bucket")).await;
    let checked = [&["results"][..], &run].concat();
    let bucket_checked = ops_with(&stack, &checked, ("RESULTS_BUCKET", "no-such-bucket")).await;
    let queue_url = format!(
        "{}/000000000000/no-such-queue",
        conveyor_testkit::endpoint()
    );
    let redrive = ["redrive", "--queue-url", queue_url.as_str()];
    let queue = ops(&stack, &redrive).await;

    // Assert: exit 5, the resource and the flag named, no SDK dump.
    for (out, named, flag) in [
        (&table, "table no-such-table", "--table (TABLE_NAME)"),
        (
            &bucket,
            "bucket no-such-bucket",
            "--bucket (RESULTS_BUCKET)",
        ),
        (
            &bucket_checked,
            "bucket no-such-bucket",
            "--bucket (RESULTS_BUCKET)",
        ),
        (&queue, "no-such-queue", "--queue-url (QUEUE_URL)"),
    ] {
        let text = stderr(out);
        assert_eq!(code(out), Some(5), "{text}");
        assert!(text.contains(named) && text.contains(flag), "{text}");
        assert!(
            !text.contains("Error {") && !text.contains("service error"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_missing_setting_names_its_variable_and_the_version_names_the_tool() {
    let mut missing = Command::new(ops_binary());
    let missing = missing
        .args(["progress", "--job", JOB, "--run", RUN])
        .env_remove("TABLE_NAME")
        .output()
        .await
        .expect("run conveyor-ops");
    let version = Command::new(ops_binary())
        .arg("--version")
        .output()
        .await
        .expect("run conveyor-ops");

    assert_eq!(code(&missing), Some(2));
    assert!(
        stderr(&missing).contains("set TABLE_NAME"),
        "{}",
        stderr(&missing)
    );
    assert!(
        stdout(&version).starts_with("conveyor-ops "),
        "{}",
        stdout(&version)
    );
}

#[tokio::test]
async fn replaying_the_quarantine_twice_never_adds_an_object_and_list_shows_why() {
    // Arrange: two poison messages quarantined by the worker.
    let stack = Stack::new().await;
    let records = vec![
        record("p1", r#"{"job_id": "j1"}"#, 1),
        record("p2", "not json", 1),
    ];
    run_batch(&stack.worker(), records).await;
    let queue = Queue::create(&stack, 30).await;
    let replay = ["replay-quarantine", "--queue-url", queue.url.as_str()];

    // Act: replay (keeping the objects), let the worker quarantine the bodies again, twice.
    for _ in 0..2 {
        succeeded(&ops(&stack, &replay).await);
        crate::ops::poll_until_drained(&stack, &queue.url).await;
    }
    let listed = succeeded(
        &ops(
            &stack,
            &["replay-quarantine", "--queue-url", &queue.url, "--list"],
        )
        .await,
    );

    // Assert: still two objects, each with its reason and its body.
    assert_eq!(quarantined(&stack).await, 2);
    assert_eq!(listed.matches("quarantine/").count(), 2, "{listed}");
    assert!(listed.contains("the body is not JSON"), "{listed}");
    assert!(listed.contains("body: not json"), "{listed}");
}

#[tokio::test]
async fn redrive_lists_each_dead_letter_once_though_the_queue_shows_it_again_at_once() {
    // Arrange: a dead-letter queue whose messages are visible again as soon as they are
    // read (a visibility timeout of 0: a listing slower than the queue's timeout, at once).
    let stack = Stack::new().await;
    let dlq = Queue::create(&stack, 0).await;
    let queue = Queue::create_with_dlq(&stack, 30, &dlq, 1).await;
    for task in ["t1", "t2", "t3"] {
        dlq.send(&stack, &body(task)).await;
    }
    let redrive = [
        "redrive",
        "--queue-url",
        queue.url.as_str(),
        "--most",
        "100",
    ];

    // Act
    let shown = succeeded(&ops(&stack, &redrive).await);

    // Assert: three lines, one a message, and the three left in the queue.
    for task in ["t1", "t2", "t3"] {
        let line = format!("{JOB}/{RUN}/{task} ");
        assert_eq!(shown.matches(&line).count(), 1, "{task}: {shown}");
    }
    assert_eq!(shown.lines().count(), 3, "{shown}");
    assert_eq!(dlq.depth(&stack).await, 3);
}

#[tokio::test]
async fn a_redrive_move_that_fails_part_way_says_what_moved_and_leaves_nothing_hidden() {
    // Arrange: three dead letters, and a task queue that is gone when they are sent back.
    let stack = Stack::new().await;
    let dlq = Queue::create(&stack, 30).await;
    let gone = Queue::create(&stack, 30).await;
    stack
        .sqs
        .delete_queue()
        .queue_url(&gone.url)
        .send()
        .await
        .expect("delete the queue");
    for task in ["t1", "t2", "t3"] {
        dlq.send(&stack, &body(task)).await;
    }
    let (dead, to) = (
        SqsQueue::new(stack.sqs.clone(), &dlq.url),
        SqsQueue::new(stack.sqs.clone(), &gone.url),
    );

    // Act
    let redriven = redrive::redrive(&dead, Some(&to), 100)
        .await
        .expect("the dead-letter queue is read");
    let again = redrive::redrive(&dead, None, 100)
        .await
        .expect("the dead-letter queue is read");

    // Assert: the move stopped at the failed send, none counted as moved, and all three
    // are there to read again at once (not hidden for the listing's 300 s).
    assert!(redriven.stopped.is_some(), "{redriven:?}");
    assert_eq!((redriven.moved, redriven.sent_not_deleted), (0, 0));
    assert_eq!(again.seen.len(), 3, "{again:?}");
}

#[tokio::test]
async fn redrive_shows_the_dead_letters_then_moves_them_back() {
    // Arrange: two tasks' messages in the dead-letter queue.
    let stack = Stack::new().await;
    let dlq = Queue::create(&stack, 30).await;
    let queue = Queue::create_with_dlq(&stack, 30, &dlq, 1).await;
    dlq.send(&stack, &body("t1")).await;
    let producer = Message::parse(Some(&body("t2")), Some(now_ms())).expect("a body");
    dlq.send(&stack, &producer.another_try(4, Some(now_ms()), now_ms()))
        .await;
    let redrive = ["redrive", "--queue-url", queue.url.as_str()];

    // Act
    let shown = succeeded(&ops(&stack, &redrive).await);
    let still = dlq.depth(&stack).await;
    let moved = ops(&stack, &[&redrive[..], &["--move"]].concat()).await;

    // Assert: shown with their tasks and left; then moved, all of them.
    assert!(
        shown.contains(&format!("{JOB}/{RUN}/t1")) && shown.contains("t2"),
        "{shown}"
    );
    assert_eq!(still, 2);
    assert!(
        stderr(&succeeded_ok(&moved)).contains("2 moved back"),
        "{}",
        stderr(&moved)
    );
    assert_eq!(dlq.depth(&stack).await, 0);
    assert_eq!(queue.depth(&stack).await, 2);
    // Moved back with the producer's fields alone: a fresh set of tries.
    for moved in queue.drain(&stack).await {
        assert_eq!(Carried::read(moved.body.as_deref()), Carried::default());
    }
}

#[tokio::test]
async fn redrive_moves_each_dead_letter_back_with_its_group_and_attributes() {
    // Arrange: a fair queue's dead letter (a tenant's group id, a message attribute), and a
    // FIFO queue's dead letter, each in its dead-letter queue.
    let stack = Stack::new().await;
    let dlq = Queue::create(&stack, 30).await;
    let queue = Queue::create_with_dlq(&stack, 30, &dlq, 1).await;
    let fifo_dlq = Queue::create_fifo(&stack, 30, None).await;
    let fifo = Queue::create_fifo(&stack, 30, Some((&fifo_dlq, 1))).await;
    let tenant = MessageAttributeValue::builder()
        .data_type("String")
        .string_value("acme")
        .build()
        .expect("a data type");
    let sent = stack
        .sqs
        .send_message()
        .queue_url(&dlq.url)
        .message_body(body("t1"));
    let sent = sent
        .message_group_id("tenant-a")
        .message_attributes("tenant", tenant);
    sent.send().await.expect("send to the dead-letter queue");
    fifo_dlq
        .send_grouped(&stack, &[(body("t2"), Some("group-b".into()))])
        .await;

    // Act
    for (queue, dead) in [(&queue, &dlq), (&fifo, &fifo_dlq)] {
        let redrive = ["redrive", "--queue-url", queue.url.as_str(), "--move"];
        succeeded(&ops(&stack, &redrive).await);
        assert_eq!(dead.depth(&stack).await, 0);
    }

    // Assert: each back in its task queue with its group; the attribute kept.
    let [fair] = <[_; 1]>::try_from(queue.drain(&stack).await).expect("one message");
    assert_eq!(fair.attributes["MessageGroupId"], "tenant-a");
    let kept = &fair.message_attributes["tenant"];
    assert_eq!(kept.string_value.as_deref(), Some("acme"));
    let [ordered] = <[_; 1]>::try_from(fifo.drain(&stack).await).expect("one message");
    assert_eq!(ordered.attributes["MessageGroupId"], "group-b");
}

#[tokio::test]
async fn a_fifo_dead_letter_queue_is_listed_whole_and_keeps_each_groups_order() {
    // Arrange: a FIFO dead-letter queue holding 15 messages of one group and 3 of another:
    // SQS gives out at most 10 of a group while they are being read.
    let stack = Stack::new().await;
    let dlq = Queue::create_fifo(&stack, 30, None).await;
    let fifo = Queue::create_fifo(&stack, 30, Some((&dlq, 1))).await;
    let long: Vec<String> = (0..15).map(|i| format!("a{i:02}")).collect();
    let short: Vec<String> = (0..3).map(|i| format!("b{i}")).collect();
    let grouped = |tasks: &[String], group: &str| -> Vec<(String, Option<String>)> {
        let group = Some(group.to_owned());
        tasks.iter().map(|t| (body(t), group.clone())).collect()
    };
    for chunk in grouped(&long, "group-a").chunks(10) {
        dlq.send_grouped(&stack, chunk).await;
    }
    dlq.send_grouped(&stack, &grouped(&short, "group-b")).await;
    let list = ["redrive", "--queue-url", fifo.url.as_str()];

    // Act: listed twice.
    let first = ops(&stack, &list).await;
    let second = ops(&stack, &list).await;

    // Assert: every message, each once, both times; still there, each group in its order.
    for listed in [&first, &second] {
        let printed = succeeded(listed);
        let tasks: Vec<&str> = printed
            .lines()
            .filter_map(|line| line.split_whitespace().nth(1))
            .collect();
        assert_eq!(tasks.len(), 18, "{printed}");
        for task in long.iter().chain(&short) {
            let named = format!("{JOB}/{RUN}/{task}");
            assert_eq!(tasks.iter().filter(|t| **t == named).count(), 1, "{task}");
        }
    }
    assert!(
        stderr(&second).contains("back of its group"),
        "{}",
        stderr(&second)
    );
    let kept = dlq.take_all(&stack).await;
    let order = |group: &str| -> Vec<String> {
        let in_group = kept
            .iter()
            .filter(|m| m.attributes["MessageGroupId"] == group);
        let tasks = in_group.map(|m| parse_body(m.body.as_deref()).expect("a task"));
        tasks.map(|t| t.task_id.to_string()).collect()
    };
    assert_eq!(order("group-a"), long);
    assert_eq!(order("group-b"), short);
}
