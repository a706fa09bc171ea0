//! The guarantees against AWS as production has it, not as the emulator forgives: the
//! worker's clients talk to moto through the production-like layer (`scripts/prodlike.py`):
//! transactions that overlap on an item are cancelled, eventually consistent reads may be
//! stale, S3 refuses request headers over 8 KB and answers 409 to racing conditional PUTs.
//! A test asks the layer for exactly the conflicts it means to meet, whatever the timing.

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_testkit::queue::Queue;
use conveyor_testkit::scenario::{self, Scenario};
use conveyor_testkit::*;
use conveyor_worker::batch::{BatchLimits, process_batch};
use conveyor_worker::domain::message::{Carried, Message};
use conveyor_worker::pushback::retry::RetryPolicy;
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::wiring::config::DuplicatePolicy;
use conveyor_worker::worker::MAX_COPIES;

#[tokio::test]
async fn a_terminal_write_meeting_a_transaction_on_its_run_is_tried_again_in_the_invocation() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    stack.conflict_on_run(JOB, RUN, 3).await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("tasks_succeeded"), Some(1));
    assert_eq!(run.n("tasks_remaining"), Some(999));
    assert_eq!(site.hits("/page/a"), 1, "fetched once");
    assert_eq!(stack.layer_count("transaction_conflicts").await, 3);
}

#[tokio::test]
async fn a_persisting_conflict_comes_back_soon_and_its_redelivery_does_not_fetch_again() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    let queue = Queue::create(&stack, 60).await;
    queue.send(&stack, &body("t1")).await;
    let first = queue.receive(&stack).await.expect("the first delivery");
    // As many conflicts as a delivery tries its write.
    let attempts = RetryPolicy::default().attempts;
    stack.conflict_on_run(JOB, RUN, attempts).await;

    let reply = run_batch(&stack.worker(), vec![first]).await;

    assert_eq!(retried(&reply).len(), 1, "the conflict outlasted the tries");
    assert_eq!(stack.task("t1").await.status(), Some("processing"));
    // Held for less than 3 s, not the queue's 60: what the worker set, whatever the speed.
    let holds = stack.calls.holds();
    assert!(
        !holds.is_empty() && holds.iter().all(|hold| *hold < 3),
        "held {holds:?} s"
    );
    let (again, after) = queue
        .wait_for_redelivery(&stack, Duration::from_secs(30))
        .await;
    println!("a persisting conflict: held {holds:?} s, back after {after:?}");
    let reply = run_batch(&stack.worker(), vec![again]).await;
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(stack.run_item(JOB, RUN).await.n("tasks_succeeded"), Some(1));
    assert_eq!(
        site.hits("/page/a"),
        1,
        "the redelivery adopted the stored page"
    );
}

#[tokio::test]
async fn on_the_final_attempt_a_conflict_is_waited_out_until_the_cutoff() {
    // The dead-letter queue is next: the task would stay unfinished and its run open.
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/page/a"), "processing")
        .await;
    stack.conflict_on_run(JOB, RUN, 10).await; // more than a delivery tries

    let reply = run_batch(
        &stack.worker(),
        vec![record("t1", &body("t1"), MAX_ATTEMPTS)],
    )
    .await;

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
}

#[tokio::test]
async fn a_claim_meeting_a_transaction_on_its_task_is_tried_again() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    stack.conflict_on_task("t1", 3).await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(stack.layer_count("write_conflicts").await, 3);
}

#[tokio::test]
async fn a_conditional_put_racing_another_is_tried_again() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    stack.conflict_on_object(&Stack::key("t1"), 3).await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(stack.layer_count("put_conflicts").await, 3);
}

#[tokio::test]
async fn a_task_written_just_before_its_message_is_processed_not_dropped() {
    // The producer writes the job, run and task, then sends the message: the worker reads
    // within the emulated replication lag.
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(site.hits("/page/a"), 1);
}

#[tokio::test]
async fn a_task_requeued_just_now_is_processed_again_not_read_as_terminal() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "failed").await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // failed long enough ago
    stack.put_task("t1", &site.url("/page/a"), "pending").await; // re-queued just now

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(site.hits("/page/a"), 1);
}

#[tokio::test]
async fn a_9000_character_content_type_is_cut_so_the_page_is_stored() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/long-type/9000"), "pending")
        .await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    let content_type = task.s("content_type").expect("a content type");
    assert_eq!(content_type.len(), 512);
    assert!(content_type.starts_with("text/html; x=aaa"));
    assert!(content_type.contains("...[cut: 9000 bytes, sha256 "));
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(object.content_type, content_type);
    assert_eq!(stack.layer_count("header_refusals").await, 0);
}

#[tokio::test]
async fn a_long_final_url_is_cut_in_the_task_and_in_the_metadata() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/long-redirect/5000"), "pending")
        .await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    let final_url = task.s("final_url").expect("a final url");
    assert_eq!(final_url.len(), 2048);
    assert!(final_url.starts_with(&site.url("/page/long?pad=aaa")));
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(object.metadata["final-url"].len(), 560);
    assert_eq!(stack.layer_count("metadata_refusals").await, 0);
}

/// moto's item size limit (DynamoDB's is 400 KB; moto allows a little more): 405,000 bytes
/// of attribute names and values, numbers counted by their digits.
const MOTO_ITEM_LIMIT: usize = 405_000;

fn item_size(item: &attributes::Item) -> usize {
    let value = |v: &AttributeValue| match v {
        AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
        _ => panic!("only strings and numbers here"),
    };
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

#[tokio::test]
async fn a_task_record_refused_as_too_large_is_written_with_what_describes_the_object() {
    // The producer's task item is 300 bytes short of the limit (a large attribute of its
    // own): the full success record does not fit, the minimal one does.
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    let url = site.url("/long-type/500");
    let mut item = keys::task_key(&task_ref("t1"));
    item.extend(attributes::strings(&[
        ("url", &url),
        ("status", "processing"),
        ("updated_at", "2026-11-30T06:01:27.123Z"),
    ]));
    item.insert("attempts".into(), attributes::n(1));
    let pad = MOTO_ITEM_LIMIT - 300 - item_size(&item) - "notes".len();
    item.insert("notes".into(), attributes::s(&"n".repeat(pad)));
    stack.put_item(item).await;

    let reply = run_batch(&stack.worker(), vec![record("t1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty(), "not retried until the DLQ");
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(task.s("content_type"), None, "left out to fit");
    assert_eq!(stack.run_item(JOB, RUN).await.n("tasks_succeeded"), Some(1));
}

/// Runs a batch of `records` with `left` before the invocation's deadline.
pub(crate) async fn run_batch_with(
    worker: &TestWorker,
    records: Vec<aws_lambda_events::event::sqs::SqsMessage>,
    left: Duration,
) -> aws_lambda_events::event::sqs::SqsBatchResponse {
    init_logs();
    let deadline = SystemTime::now() + left;
    process_batch(worker, &records, &unique("request"), deadline, LIMITS).await
}

#[tokio::test]
async fn no_fetch_starts_without_time_left_to_store_its_page() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    let worker = stack.worker_with(|t| t.store_reserve = Duration::from_secs(2));

    // 2.5 s to the deadline, 0.5 s of margin: the cutoff is 2 s away, all of it reserved.
    let reply = run_batch_with(&worker, vec![delivery("t1")], Duration::from_millis(2500)).await;

    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(site.hits("/page/a"), 0);
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("pending"), "not even claimed");
    assert_eq!(
        stack.calls.calls(),
        ["ChangeMessageVisibility"],
        "made visible at once"
    );
}

#[tokio::test]
async fn a_final_attempt_without_time_left_is_sent_again_and_still_gets_its_last_try() {
    // Arrange: a message whose receive is the final attempt (earlier copies spent the rest).
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/down/a"), "pending").await;
    let queue = Queue::create(&stack, 60).await;
    let spent = another_try(&body("t1"), MAX_ATTEMPTS - 1, None);
    queue.send(&stack, &spent).await;
    let last = queue.receive(&stack).await.expect("the final attempt");
    let worker = stack.worker_with(|t| t.store_reserve = Duration::from_secs(2));

    // Act: no time left to fetch; then the copy, with time.
    let reply = run_batch_with(&worker, vec![last], Duration::from_millis(2500)).await;
    let copy = queue.receive(&stack).await.expect("a fresh copy");
    let again = run_batch_with(&worker, vec![copy.clone()], Duration::from_secs(30)).await;

    // Assert: acked, not dead-lettered; the copy kept the receives and failed the task as the
    // final attempt it is.
    assert!(retried(&reply).is_empty(), "the copy replaces it");
    let copy_body = copy.body.as_deref();
    assert_eq!(Carried::read(copy_body).receives_before, MAX_ATTEMPTS - 1);
    assert_eq!(Carried::read(copy_body).copies, 2);
    assert!(retried(&again).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("failed"), "{task:?}");
    assert_eq!(site.hits("/down/a"), 1, "one fetch, on the last try");
}

#[tokio::test]
async fn a_final_attempt_aws_pushed_back_on_is_sent_again_for_two_hours_whatever_its_copies() {
    // Arrange: two final attempts past their ten copies, AWS having pushed back on their
    // copies since an hour ago (t1) and three hours ago (t2); every write throttled.
    let stack = Stack::prodlike().await;
    let site = Site::start().await;
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    stack.put_task("t2", &site.url("/page/b"), "pending").await;
    let queue = Queue::create(&stack, 60).await;
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let (an_hour_ago, three_hours_ago) = (now_ms - 3_600_000, now_ms - 3 * 3_600_000);
    for (task, since) in [("t1", an_hour_ago), ("t2", three_hours_ago)] {
        let mut copied = body(task);
        for _ in 0..MAX_COPIES {
            copied = another_try(&copied, MAX_ATTEMPTS - 1, Some(since));
        }
        queue.send(&stack, &copied).await;
    }
    let records = vec![
        queue.receive(&stack).await.expect("a final attempt"),
        queue.receive(&stack).await.expect("the other"),
    ];
    stack.throttle_writes(1.0, 30.0).await;

    // Act
    let reply = run_batch_with(&stack.worker(), records.clone(), Duration::from_secs(30)).await;

    // Assert: t1 acked for a copy that keeps when the push-back began; t2 left to the
    // redrive policy; neither task was fetched.
    let id_of = |task: &str| {
        let record = records
            .iter()
            .find(|r| r.body.as_deref().unwrap_or("").contains(task));
        record
            .and_then(|r| r.message_id.clone())
            .expect("its record")
    };
    assert_eq!(retried(&reply), [id_of("t2")]);
    // t2 comes back too (held 1 s or so), before or after the copy.
    let mut back = Vec::new();
    for _ in 0..2 {
        back.push(
            queue
                .wait_for_redelivery(&stack, Duration::from_secs(15))
                .await
                .0,
        );
    }
    let copy = back
        .into_iter()
        .find(|m| m.message_id != Some(id_of("t2")))
        .expect("a copy of t1");
    let copy_body = copy.body.as_deref();
    assert!(copy_body.unwrap_or("").contains("t1"), "{copy:?}");
    assert_eq!(Carried::read(copy_body).copies, MAX_COPIES + 1);
    assert_eq!(Carried::read(copy_body).pressed_since, Some(an_hour_ago));
    assert_eq!(site.hits("/page/a") + site.hits("/page/b"), 0);
}

#[tokio::test]
async fn a_final_attempt_the_batch_never_reached_before_its_cutoff_is_sent_again() {
    // Arrange: a batch over its concurrency (one at a time); the first record's page is
    // stored slowly (every S3 request takes 5 s), so the cutoff comes while it stores; the
    // second record, its task's final attempt, never starts.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    stack.put_task("t2", &site.url("/page/b"), "pending").await;
    let queue = Queue::create(&stack, 60).await;
    queue
        .send(&stack, &another_try(&body("t2"), MAX_ATTEMPTS - 1, None))
        .await;
    let last = queue.receive(&stack).await.expect("t2's final attempt");
    let slow = chaos::Faults {
        error_rate: 0.0,
        slow_rate: 1.0,
        delay: Duration::from_secs(5),
    };
    let worker = stack.worker_with(|t| t.s3_faults = Some(slow));
    let one_at_a_time = BatchLimits {
        max_concurrency: 1,
        ..LIMITS
    };

    // Act: 4 s to the deadline, the cutoff at 3.5 s.
    let deadline = SystemTime::now() + Duration::from_secs(4);
    let records = vec![delivery("t1"), last];
    let reply = process_batch(
        &worker,
        &records,
        &unique("request"),
        deadline,
        one_at_a_time,
    )
    .await;
    let copy = queue.receive(&stack).await.expect("a fresh copy of t2");

    // Assert: t1 goes back to the queue; t2 is acked, its copy carrying the receives spent.
    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(
        Carried::read(copy.body.as_deref()).receives_before,
        MAX_ATTEMPTS - 1
    );
    assert_eq!(site.hits("/page/b"), 0, "t2 was never tried");
    assert_eq!(stack.task("t2").await.status(), Some("pending"));
}

#[tokio::test]
async fn a_fetch_stopped_by_the_invocation_budget_is_not_the_pages_failure() {
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/slow/4000"), "pending")
        .await;
    let worker = stack.worker_with(|t| t.store_reserve = Duration::from_secs(1));
    let final_attempt = record("t1", &body("t1"), MAX_ATTEMPTS);
    let started = std::time::Instant::now();

    // 3.5 s to the deadline: the cutoff is 3 s away, the fetch gets 2 s of it.
    let reply = run_batch_with(&worker, vec![final_attempt], Duration::from_millis(3500)).await;

    assert_eq!(retried(&reply), ["t1"], "not failed for our own budget");
    assert!(started.elapsed() < Duration::from_millis(3200));
    assert_eq!(stack.task("t1").await.status(), Some("processing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_table_throttles_half_its_writes_nothing_is_lost_and_the_worker_backs_off() {
    // Arrange: 100 tasks counted in 8 shards behind the production-like layer. Politeness
    // is off: the run is on one local site, where a host's rate would make this a test of
    // host waits (tests/it/polite_defaults.rs); the holds are scaled down (200 ms doubling).
    let scenario = Scenario {
        tasks: 100,
        policy: DuplicatePolicy::Converge,
        production_like: true,
        counters: (8, 0),
        ..Scenario::default()
    };
    let prepared = scenario::prepare_on(Stack::prodlike().await, scenario).await;
    let stack = &prepared.stack;

    // Act: from the first second, half the table's writes are throttled for 3 s.
    let throttle = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stack.throttle_writes(0.5, 3.0).await;
    };
    let ((_, seconds), ()) = tokio::join!(prepared.drain(scenario), throttle);
    let report = prepared.check(None, seconds, "in process").await;

    // Assert: throttling happened; every invariant held (every task ended once or is in the
    // dead-letter queue, counters = states, one completion, no message lost). (That a
    // throttled record is held back, not retried at once: ack_contract.rs.)
    let (writes, throttled) = (
        stack.layer_count("writes").await,
        stack.layer_count("throttled").await,
    );
    println!(
        "throttled: {throttled} of {writes} writes refused; {}; {} holds",
        report.line(),
        stack.calls.count("ChangeMessageVisibility")
    );
    assert!(throttled > 0, "the throttle never met a write");
    assert_eq!(
        report.successful + report.failed + report.dead_lettered,
        report.total
    );
}

/// A copy of `body` for another try, as the worker sends one now: `spent` receives behind it.
fn another_try(body: &str, spent: u32, pressed_at: Option<u64>) -> String {
    let message = Message::parse(Some(body), None).expect("a task's body");
    message.another_try(spent, pressed_at, now_ms())
}
