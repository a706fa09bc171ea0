//! Every way a message is born, end to end: a failure of ours is bounded whatever waits come
//! between, a message back from the dead-letter queue or re-queued gets a fresh set of tries,
//! copies keep the producer's message group and attributes, a parked copy never meets its own
//! lease, and records the strained sandbox never started are not dead-lettered untried.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use conveyor_testkit::forward_proxy::ForwardProxy;
use conveyor_testkit::polite_site::{Behaviour, PoliteSite};
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::Outcome;
use conveyor_worker::batch::ProcessRecord;
use conveyor_worker::domain::message::{Carried, Message, REDRIVE_GAP};
use conveyor_worker::domain::model::TaskStatus;
use conveyor_worker::domain::proxy::Tiers;
use conveyor_worker::ports::tasks::{Lease, TaskStore, TriesFrom};
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::wiring::config::DuplicatePolicy;

use crate::polite_defaults::production_defaults;
use crate::politeness::{Fleet, assert_once_each_but_doubled, drain_tuned, pages, tasks_of};
use crate::production::run_batch_with;

/// A job whose hosts take 2 requests a second; robots.txt asked or not.
async fn slow_job(stack: &Stack, obey_robots: bool) {
    let mut item = keys::job_key(&id(JOB));
    item.insert("status".into(), attributes::s("active"));
    item.insert("host_max_rps".into(), attributes::n(2));
    let obey = aws_sdk_dynamodb::types::AttributeValue::Bool(obey_robots);
    item.insert("obey_robots".into(), obey);
    stack.put_item(item).await;
}

/// Eight tasks of one host at 2 a second (its schedule booked ahead, so tasks wait as parked
/// copies between tries), drained through a proxy that wants credentials the worker does not
/// have, politeness at its production defaults: every message must end in the dead-letter
/// queue with its task open, the site never reached. Answers the proxy's requests.
async fn busy_host_through_a_407_proxy(obey_robots: bool) -> usize {
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    let proxy = ForwardProxy::start(IpAddr::from([127, 0, 0, 1]), true).await;
    slow_job(&stack, obey_robots).await;
    let (queue, dlq) = tasks_of(&stack, &pages(&site, "page", 8)).await;
    let tiers = Tiers::parse(&proxy.url()).expect("proxy URLs");
    let tune = |t: &mut WorkerTuning| {
        t.politeness = production_defaults();
        t.proxies = tiers.clone();
        t.backoff.max = Duration::from_secs(4);
    };
    let fleet = Fleet {
        sandboxes: 2,
        pollers: 2,
        timeout: Duration::from_secs(10),
        limit: Duration::from_secs(240),
    };

    let drained = drain_tuned(&stack, &queue, &tune, fleet).await;

    // SQS may hand one message to two pollers at once, and each parks its own copy: every
    // task is in the dead-letter queue, a task more than once only by such a delivery.
    let dead = dlq.drain(&stack).await;
    let mut letters = std::collections::BTreeMap::new();
    for message in &dead {
        *letters.entry(task_of(message.body.as_deref())).or_insert(0) += 1;
    }
    let all: Vec<String> = (0..8).map(|i| format!("t{i:03}")).collect();
    let tasks: Vec<&String> = letters.keys().collect();
    assert_eq!(
        tasks,
        all.iter().collect::<Vec<_>>(),
        "every task's message in the dead-letter queue"
    );
    assert_once_each_but_doubled("dead-lettered", &letters, &drained.doubled);
    for i in 0..8 {
        let task = stack.task(&format!("t{i:03}")).await;
        assert_eq!(task.status(), Some("processing"), "{task:?}");
        assert!(task.s("tries_spent").is_some(), "{task:?}");
    }
    assert_eq!(site.hits("/"), 0, "the site never reached");
    let requests = proxy.requests().len();
    println!("proxy requests: {requests} for 8 tasks (robots.txt obeyed: {obey_robots})");
    requests
}

/// The task id a message's body names.
fn task_of(body: Option<&str>) -> String {
    let message = Message::parse(body, None).expect("a body");
    message.task.task_id.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_that_fails_on_a_busy_host_sends_its_tasks_to_the_dead_letter_queue_after_their_tries()
 {
    let requests = busy_host_through_a_407_proxy(false).await;

    // Each task tried a bounded number of times: its attempts, then the last message's
    // receives.
    assert!(
        requests <= 8 * 2 * MAX_ATTEMPTS as usize,
        "{requests} requests"
    );
    assert!(requests >= 8 * MAX_ATTEMPTS as usize, "{requests} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_that_cannot_fetch_robots_txt_sends_the_hosts_tasks_to_the_dead_letter_queue() {
    let requests = busy_host_through_a_407_proxy(true).await;

    // robots.txt asked through the proxy once a minute for the fleet, no page.
    assert!(requests <= 8, "{requests} requests");
}

#[tokio::test]
async fn a_message_back_from_the_dead_letter_queue_gets_a_fresh_set_of_tries() {
    // Arrange: a task whose tries were spent an hour ago, and the copy SQS's own redrive
    // sends back as it was written then: its receives, copies and waits all but spent.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/flaky/a"), "pending").await;
    let an_hour_ago = now_ms() - 3_600_000;
    set_tries(&stack, "t1", MAX_ATTEMPTS, an_hour_ago).await;
    let producer = Message::parse(Some(&body("t1")), Some(an_hour_ago)).expect("a body");
    let spent = producer.another_try(MAX_ATTEMPTS - 1, None, an_hour_ago);
    let queue = Queue::create(&stack, 60).await;
    queue.send(&stack, &spent).await;
    let worker = stack.worker();

    // Act: its receives, as the queue hands them back.
    let mut replies = Vec::new();
    for _ in 0..3 {
        let (record, _) = queue
            .wait_for_redelivery(&stack, Duration::from_secs(20))
            .await;
        let reply = run_batch(&worker, vec![record]).await;
        replies.push(retried(&reply).len());
        if replies.last() == Some(&0) {
            break;
        }
    }

    // Assert: the page's two 503s were retried, not its final attempt's failure.
    assert_eq!(replies, [1, 1, 0], "two retries, then done");
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    assert_eq!(task.n("attempts"), Some(3), "a fresh set: 3 tries");
}

/// The task's set of tries as an earlier line left it.
async fn set_tries(stack: &Stack, task: &str, attempts: u32, since: u64) {
    stack
        .dynamodb
        .update_item()
        .table_name(&stack.table)
        .set_key(Some(keys::task_key(&task_ref(task))))
        .update_expression("SET attempts = :a, tries_since = :s")
        .expression_attribute_values(":a", attributes::n(attempts))
        .expression_attribute_values(":s", attributes::n(since))
        .send()
        .await
        .expect("set the task's tries");
}

#[tokio::test]
async fn a_copy_keeps_the_producers_message_group_and_attributes() {
    // Arrange: a fair queue's message (a group id on a standard queue) with an attribute of
    // the producer's, on its final attempt, with no time left to fetch.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    let queue = Queue::create(&stack, 60).await;
    let last = Message::parse(Some(&body("t1")), None)
        .expect("a body")
        .another_try(MAX_ATTEMPTS - 1, None, now_ms());
    let tenant = MessageAttributeValue::builder()
        .data_type("String")
        .string_value("acme")
        .build()
        .expect("a data type");
    stack
        .sqs
        .send_message()
        .queue_url(&queue.url)
        .message_body(last)
        .message_group_id("tenant-acme")
        .message_attributes("tenant", tenant)
        .send()
        .await
        .expect("send");
    let record = queue.receive(&stack).await.expect("the final attempt");
    let worker = stack.worker_with(|t| t.store_reserve = Duration::from_secs(2));

    // Act: no time left to fetch: a fresh copy for its last try.
    let reply = run_batch_with(&worker, vec![record], Duration::from_millis(2500)).await;
    let copy = stack
        .sqs
        .receive_message()
        .queue_url(&queue.url)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .wait_time_seconds(5)
        .send()
        .await
        .expect("receive");

    // Assert
    assert!(retried(&reply).is_empty(), "the copy replaces it");
    let copy = &copy.messages()[0];
    let group = copy
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId));
    assert_eq!(group.map(String::as_str), Some("tenant-acme"));
    let attribute = copy.message_attributes().and_then(|a| a.get("tenant"));
    assert_eq!(attribute.and_then(|a| a.string_value()), Some("acme"));
    assert_eq!(Carried::read(copy.body()).copies, 2);
}

#[tokio::test]
async fn a_claim_given_back_gives_back_its_lease_too() {
    // Arrange: a claim under a lease (a parked copy come due, whose host then said wait).
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack
        .put_task("t1", "http://127.0.0.1:9/a", "pending")
        .await;
    let tasks = stack.worker_with(|t| t.duplicate_policy = DuplicatePolicy::Lease);
    let lease = Lease {
        owner: "request/message",
        until: SystemTime::now() + Duration::from_secs(600),
    };
    let claimed = tasks
        .tasks
        .claim(
            &task_ref("t1"),
            SystemTime::now(),
            Some(lease),
            TriesFrom::default(),
        )
        .await
        .expect("claimed");

    // Act
    tasks
        .tasks
        .unclaim(&task_ref("t1"), TaskStatus::Pending, Some(lease.owner))
        .await
        .expect("given back");

    // Assert: the next delivery (the copy) meets no lease.
    assert!(matches!(
        claimed,
        conveyor_worker::ports::tasks::Claim::Claimed { .. }
    ));
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("pending"));
    assert_eq!(task.n("attempts"), Some(0));
    assert_eq!(task.s("lease_owner"), None, "{task:?}");
}

#[tokio::test]
async fn a_final_attempt_the_strained_sandbox_never_started_is_copied_for_later_not_at_once() {
    // Arrange: an in-process worker whose pressure AWS has strained, and a record on its
    // final receive that the cutoff stopped before it started.
    let pages = memory::MemoryPages {
        body: bytes::Bytes::from_static(b"page"),
        delay: Duration::ZERO,
    };
    let worker = memory::worker(pages, 1, "http://example.com/a");
    for _ in 0..2 {
        let throttled = conveyor_worker::ports::error::StoreError::failed(
            "TransactWriteItems",
            conveyor_worker::ports::error::StoreFault::Throttled,
            "slow down",
        );
        worker.pressure.learn(&Outcome::Store(throttled));
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    let mut last = record("m1", &body("t0"), MAX_ATTEMPTS);
    last.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:tasks".into());

    // Act
    let outcome = worker.out_of_time(&last).await;

    // Assert: a copy for AWS's push-back (bounded by time, due after a hold), not one due at
    // once that spends one of its ten.
    assert!(worker.pressure.strain() > 1.0);
    let Outcome::SentAgain { delay } = outcome else {
        panic!("sent again: {outcome:?}");
    };
    assert!(delay >= Duration::from_millis(500), "{delay:?}");
    let copies = worker.visibility.copies();
    assert!(Carried::read(Some(&copies[0].body)).pressed_since.is_some());
}

#[test]
fn a_redrive_is_told_from_a_copy_by_when_sqs_took_it() {
    let copy = Message::parse(Some(&body("t1")), Some(1_000))
        .expect("a body")
        .another_try(MAX_ATTEMPTS - 1, None, 2_000);
    let gap = REDRIVE_GAP.as_millis() as u64;

    let copied = Message::parse(Some(&copy), Some(2_000 + gap)).expect("a body");
    let redriven = Message::parse(Some(&copy), Some(2_001 + gap)).expect("a body");

    assert_eq!(copied.carried.receives_before, MAX_ATTEMPTS - 1);
    assert_eq!(copied.carried.tries_since, Some(1_000));
    assert_eq!(redriven.carried.receives_before, 0);
    assert_eq!(redriven.carried.tries_since, Some(2_001 + gap));
}

#[tokio::test]
async fn on_a_fifo_queue_waits_and_holds_move_to_the_back_of_their_group_before_the_last_receive() {
    // Arrange: a FIFO queue; a host cooling down for a minute; group g's t1 on its first
    // receive (its host says wait) and t2 behind it on the receive before its last; group
    // h's t3, whose host says wait, on the receive before its last.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    stack.put_active_run().await;
    for (task, page) in [("t1", "/page/1"), ("t2", "/page/2"), ("t3", "/page/3")] {
        stack.put_task(task, &site.url(page), "pending").await;
    }
    cool_down(&stack, &site).await;
    let fifo = Queue::create_fifo(&stack, 30, None).await;
    let (url, arn) = (fifo.url.clone(), fifo.arn.clone());
    let on_fifo = |task: &str, group: &str, receives: u32| {
        let mut record = record(task, &body(task), receives);
        record.event_source_arn = Some(arn.clone());
        record
            .attributes
            .insert("MessageGroupId".into(), group.into());
        record
    };
    let records = vec![
        on_fifo("t1", "g", 1),
        on_fifo("t2", "g", MAX_ATTEMPTS - 1),
        on_fifo("t3", "h", MAX_ATTEMPTS - 1),
    ];
    let worker = stack.worker_with(|t| t.politeness = production_defaults());

    // Act
    let reply = run_batch(&worker, records).await;

    // Assert: t1 held back (its wait burns a receive it can spare); t2, held behind it, and
    // t3, waiting, acked for copies at the back of their groups.
    assert_eq!(retried(&reply), ["t1"]);
    let copies = stack
        .sqs
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .expect("receive");
    let mut copies: Vec<_> = copies
        .messages()
        .iter()
        .map(|m| {
            let group = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId));
            let carried = Carried::read(m.body());
            (task_of(m.body()), group.cloned(), carried.waits)
        })
        .collect();
    copies.sort();
    assert_eq!(
        copies,
        [
            ("t2".to_owned(), Some("g".to_owned()), 0),
            ("t3".to_owned(), Some("h".to_owned()), 1)
        ]
    );
    assert_eq!(site.hits("/"), 0);
}

#[tokio::test]
async fn on_a_fifo_queue_receives_its_waits_burned_do_not_make_a_final_attempt() {
    // Arrange: a FIFO queue; a page down for now (503) whose task was tried once, its message
    // on its last receive (its waits burned the others: each gave its claim back).
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/down/1"), "pending").await;
    let fifo = Queue::create_fifo(&stack, 30, None).await;
    let mut last = record("t1", &body("t1"), MAX_ATTEMPTS);
    last.event_source_arn = Some(fifo.arn.clone());
    last.attributes.insert("MessageGroupId".into(), "g".into());

    // Act
    let reply = run_batch(&stack.worker(), vec![last]).await;

    // Assert: not failed on a second try; acked for a copy at the back of its group, one
    // copy more, the task open.
    assert!(retried(&reply).is_empty(), "{:?}", retried(&reply));
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("processing"));
    assert_eq!(task.n("attempts"), Some(1));
    let [copy] = <[_; 1]>::try_from(fifo.drain(&stack).await).expect("one copy");
    assert_eq!(copy.attributes["MessageGroupId"], "g");
    assert_eq!(Carried::read(copy.body.as_deref()).copies, 1);
}

#[tokio::test]
async fn on_a_fifo_queue_records_held_behind_a_retried_one_wait_for_its_hold_alone() {
    // Arrange: a FIFO group of two: t1's page is down for now (503), t2's is fine; both
    // received in one batch, in flight for ten minutes.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/down/1"), "pending").await;
    stack.put_task("t2", &site.url("/page/2"), "pending").await;
    let fifo = Queue::create_fifo(&stack, 30, None).await;
    let group = Some("g".to_owned());
    let bodies = [(body("t1"), group.clone()), (body("t2"), group)];
    let ids = fifo.send_grouped(&stack, &bodies).await;
    let records = fifo.drain(&stack).await;
    let worker = stack.worker_with(|t| {
        t.politeness = production_defaults();
        t.backoff.max = Duration::from_secs(1);
    });

    // Act
    let reply = run_batch(&worker, records).await;

    // Assert: both retried, t2 untried; the group comes back after t1's hold of at most a
    // second, not after t2's ten minutes in flight, and in its order.
    assert_eq!(retried(&reply), ids);
    assert_eq!(site.hits("/page/2"), 0);
    let limit = Duration::from_secs(20);
    let (first, _) = fifo.wait_for_redelivery(&stack, limit).await;
    assert_eq!(first.message_id.as_ref(), Some(&ids[0]));
}

/// The host of `site` cooling down for another minute, as a 429 leaves it.
async fn cool_down(stack: &Stack, site: &PoliteSite) {
    let host = site.url("").trim_start_matches("http://").to_owned();
    let mut item = keys::host_key(&host, "HOST");
    let until = now_ms() + 60_000;
    item.insert("cooldown_until".into(), attributes::n(until));
    item.insert("touched_at".into(), attributes::n(now_ms()));
    stack.put_item(item).await;
}

#[tokio::test]
async fn a_redriven_message_that_waited_for_its_host_still_gets_a_fresh_set_of_tries() {
    // Arrange: a task whose tries were spent an hour ago; the parked copy of a message SQS
    // redrove just now (its line began now), booked for its host's turn in half a second.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/1"), "pending").await;
    set_tries(&stack, "t1", MAX_ATTEMPTS, now_ms() - 3_600_000).await;
    let redriven = Message::parse(Some(&body("t1")), Some(now_ms())).expect("a body");
    let parked = redriven.parked(Some(now_ms() + 500), now_ms());
    let queue = Queue::create(&stack, 60).await;
    queue.send(&stack, &parked).await;
    let record = queue.receive(&stack).await.expect("the parked copy");
    let worker = stack.worker_with(|t| t.politeness = production_defaults());

    // Act
    let reply = run_batch(&worker, vec![record]).await;

    // Assert: fetched as the first try of a fresh set, not the sixth of the spent one.
    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    assert_eq!(task.n("attempts"), Some(1), "{task:?}");
}
