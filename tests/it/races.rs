//! Duplicates and races end to end: however deliveries interleave, the task ends once and
//! its record describes the object that is actually stored. moto runs one request at a time
//! (scripts/moto_server.py), so these exercise the worker's conditions, not moto's races.

use std::time::Duration;

use conveyor_testkit::*;
use conveyor_worker::domain::model::{Counting, Sharding};
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::wiring::config::DuplicatePolicy;
use conveyor_worker::worker::converge::Converged;
use futures_util::future::join_all;

#[tokio::test]
async fn concurrent_duplicates_with_different_bytes_converge_on_the_first_stored_object() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/varying/t1"), "pending")
        .await;
    let workers: Vec<_> = (0..4).map(|_| stack.worker()).collect();

    let replies = join_all(workers.iter().map(|w| run_batch(w, vec![delivery("t1")]))).await;

    assert!(
        replies.iter().all(|r| retried(r).is_empty()),
        "every duplicate is acked"
    );
    assert_eq!(
        site.hits("/varying/t1"),
        4,
        "all four scraped at the same time"
    );
    let task = stack.task("t1").await;
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.n("attempts"), Some(4));
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(task.n("result_size"), Some(object.body.len() as u64));
    assert_eq!(object.metadata["sha256"], object.sha256());
    assert_eq!(stack.calls.count("PutObject"), 4);
    assert_eq!(stack.calls.count("UpdateItem"), 4, "four claims");
    assert_eq!(
        stack.calls.count("TransactWriteItems"),
        4,
        "four terminal writes, one won"
    );
}

#[tokio::test]
async fn the_same_message_twice_in_one_batch_ends_once_and_is_acked() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/varying/t1"), "pending")
        .await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1"), delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
}

#[tokio::test]
async fn a_terminal_write_that_loses_the_race_is_acked_and_changes_nothing() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/slow/700"), "pending")
        .await;
    let worker = stack.worker();

    let (reply, ()) = tokio::join!(run_batch(&worker, vec![delivery("t1")]), async {
        // Another delivery stores its page and finishes the task while this one is still
        // fetching.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stack
            .put_object(&Stack::key("t1"), b"the other delivery's page", 200)
            .await;
        stack
            .dynamodb
            .update_item()
            .table_name(&stack.table)
            .set_key(Some(keys::task_key(&task_ref("t1"))))
            .update_expression("SET #s = :done, finished_at = :at")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":done", attributes::s("successful"))
            .expression_attribute_values(":at", attributes::s("the other delivery"))
            .send()
            .await
            .expect("finish the task as the other delivery");
    });

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.s("finished_at"), Some("the other delivery"));
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(object.body, b"the other delivery's page");
}

#[tokio::test]
async fn a_later_failure_never_replaces_a_result_an_earlier_delivery_stored() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/status/404"), "processing")
        .await;
    stack
        .put_object(&Stack::key("t1"), b"stored before the crash", 200)
        .await;

    let reply = run_batch(&stack.worker(), vec![record("m1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert!(task.s("error").is_none());
}

#[tokio::test]
async fn a_redelivery_after_success_is_guarded_and_leaves_the_result_alone() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/varying/t1"), "pending")
        .await;
    let worker = stack.worker();
    run_batch(&worker, vec![delivery("t1")]).await;
    let first = stack.task("t1").await;

    let reply = run_batch(&worker, vec![record("t1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(site.hits("/varying/t1"), 1, "no second scrape");
    let again = stack.task("t1").await;
    assert_eq!(again.s("result_sha256"), first.s("result_sha256"));
    assert_eq!(again.s("finished_at"), first.s("finished_at"));
}

fn lease_worker(stack: &Stack) -> TestWorker {
    stack.worker_with(|t| t.duplicate_policy = DuplicatePolicy::Lease)
}

#[tokio::test]
async fn with_leases_a_concurrent_duplicate_waits_instead_of_scraping() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/varying/t1"), "pending")
        .await;
    let (a, b) = (lease_worker(&stack), lease_worker(&stack));

    let (first, second) = tokio::join!(
        run_batch(&a, vec![delivery("t1")]),
        run_batch(&b, vec![delivery("t1")])
    );

    let retried_count = retried(&first).len() + retried(&second).len();
    assert_eq!(retried_count, 1, "the duplicate waits for the lease");
    assert_eq!(site.hits("/varying/t1"), 1, "one fetch");
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    assert!(task.s("lease_owner").is_none() && task.n("lease_until").is_none());
}

#[tokio::test]
async fn a_live_lease_of_another_invocation_is_waited_for() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/page/a"), "processing")
        .await;
    let later = std::time::SystemTime::now() + Duration::from_secs(60);
    stack.set_lease("t1", "another-invocation", later).await;

    let reply = run_batch(&lease_worker(&stack), vec![record("m1", &body("t1"), 2)]).await;

    assert_eq!(retried(&reply), ["m1"]);
    assert_eq!(site.hits("/page/a"), 0);
    assert_eq!(
        stack.calls.count("ChangeMessageVisibility"),
        1,
        "held until the lease ends"
    );
    assert_eq!(stack.task("t1").await.status(), Some("processing"));
}

#[tokio::test]
async fn an_expired_lease_is_taken_over() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/page/a"), "processing")
        .await;
    let earlier = std::time::SystemTime::now() - Duration::from_secs(1);
    stack.set_lease("t1", "a-crashed-invocation", earlier).await;

    let reply = run_batch(&lease_worker(&stack), vec![record("m1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(site.hits("/page/a"), 1);
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
}

#[tokio::test]
async fn a_lease_is_given_up_when_its_delivery_ends_without_a_terminal_write() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/flaky/t1"), "pending")
        .await;
    let worker = lease_worker(&stack);
    run_batch(&worker, vec![delivery("t1")]).await; // 503: retried

    // Redelivered at once (its hold-back was short), by another invocation.
    let reply = run_batch(&worker, vec![record("t1", &body("t1"), 2)]).await;

    assert_eq!(
        site.hits("/flaky/t1"),
        2,
        "fetched again, not held off by a dead lease"
    );
    assert_eq!(retried(&reply), ["t1"], "the second 503");
    let task = stack.task("t1").await;
    assert!(task.s("lease_owner").is_none() && task.n("lease_until").is_none());
}

#[tokio::test]
async fn a_failure_clears_the_lease_too() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/status/404"), "pending")
        .await;

    let reply = run_batch(&lease_worker(&stack), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("failed"));
    assert!(task.s("lease_owner").is_none() && task.n("lease_until").is_none());
}

/// The converge step over the stack's own stores, as a delivery past its fetch would run it.
async fn converging<F>(stack: &Stack, converge: F)
where
    F: AsyncFnOnce(&conveyor_worker::worker::converge::Stores<'_, DynamoTaskStore, S3ResultStore>),
{
    converging_counted(stack, Default::default(), converge).await;
}

/// [`converging`] into a run that counts its tasks this way.
async fn converging_counted<F>(stack: &Stack, counting: Counting, converge: F)
where
    F: AsyncFnOnce(&conveyor_worker::worker::converge::Stores<'_, DynamoTaskStore, S3ResultStore>),
{
    let worker = stack.worker();
    converging_over((&worker.tasks, &worker.results), counting, converge).await;
}

/// [`converging_counted`] over these stores.
async fn converging_over<F>(
    (tasks, results): (&DynamoTaskStore, &S3ResultStore),
    counting: Counting,
    converge: F,
) where
    F: AsyncFnOnce(&conveyor_worker::worker::converge::Stores<'_, DynamoTaskStore, S3ResultStore>),
{
    let conflicts = std::sync::atomic::AtomicU64::new(0);
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let patience =
        conveyor_worker::pushback::retry::Patience::new(until, Default::default(), &conflicts);
    let stores = conveyor_worker::worker::converge::Stores::new(tasks, results, patience, counting);
    converge(&stores).await;
}

/// t1 fails (its delivery found nothing stored), then another delivery's page is stored
/// and must win.
async fn fail_then_succeed(
    stores: &conveyor_worker::worker::converge::Stores<'_, DynamoTaskStore, S3ResultStore>,
    key: &conveyor_worker::domain::ids::ResultKey,
) {
    let failed = stores.fail(&task_ref("t1"), key, not_found()).await;
    failed.expect("fail");
    let won = stores
        .succeed(&task_ref("t1"), key, &page(b"the page"), None)
        .await;
    assert_eq!(
        won.expect("succeed"),
        Converged::Succeeded { adopted: false }
    );
}

/// Task t1, claimed by a delivery that is past its fetch; its result key.
async fn processing_task(stack: &Stack) -> conveyor_worker::domain::ids::ResultKey {
    stack
        .put_task("t1", "http://site.example/a", "processing")
        .await;
    conveyor_worker::domain::ids::ResultKey::for_task(PREFIX, &task_ref("t1"))
}

fn page(body: &'static [u8]) -> conveyor_worker::domain::model::Page {
    conveyor_worker::domain::model::Page {
        url: "http://site.example/a".into(),
        http_status: 200,
        final_url: "http://site.example/a".into(),
        content_type: "text/plain".into(),
        body: body.into(),
        validators: Default::default(),
        rendered: None,
        screenshot: None,
    }
}

fn not_found() -> conveyor_worker::domain::model::Failure {
    conveyor_worker::domain::model::Failure {
        reason: "HTTP 404".into(),
        http_status: Some(404),
    }
}

#[tokio::test]
async fn a_success_that_lost_the_write_to_a_failure_replaces_it_and_moves_the_count() {
    // Two deliveries past the guard: one fails (it checked S3 before the other stored its
    // page) and writes first; the other's page is stored and must win.
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let key = processing_task(&stack).await;

    converging(&stack, async |stores| {
        fail_then_succeed(stores, &key).await;
    })
    .await;

    let task = stack.task("t1").await;
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(task.s("error"), None);
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(
        (run.n("tasks_succeeded"), run.n("tasks_failed")),
        (Some(1), Some(0))
    );
    assert_eq!(run.n("tasks_remaining"), Some(999));
}

#[tokio::test]
async fn a_success_replacing_the_failure_that_completed_its_run_keeps_one_completion() {
    let stack = Stack::new().await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 1).await;
    let key = processing_task(&stack).await;

    converging(&stack, async |stores| {
        stores
            .fail(&task_ref("t1"), &key, not_found())
            .await
            .expect("fail");
        stores
            .succeed(&task_ref("t1"), &key, &page(b"the page"), None)
            .await
            .expect("succeed");
    })
    .await;

    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("times_completed"), Some(1));
    assert_eq!(
        (run.n("tasks_succeeded"), run.n("tasks_failed")),
        (Some(1), Some(0))
    );
    assert_eq!(run.n("tasks_remaining"), Some(0));
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
}

#[tokio::test]
async fn a_failure_never_replaces_a_success() {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let key = processing_task(&stack).await;

    converging(&stack, async |stores| {
        stores
            .succeed(&task_ref("t1"), &key, &page(b"the page"), None)
            .await
            .expect("succeed");
        // A failure that raced it: its own S3 check found the object, so it adopts.
        let late = stores.fail(&task_ref("t1"), &key, not_found()).await;
        assert_eq!(late.expect("fail"), Converged::LostRace);
    })
    .await;

    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(
        (run.n("tasks_succeeded"), run.n("tasks_failed")),
        (Some(1), Some(0))
    );
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
}

#[tokio::test]
async fn in_a_sharded_run_a_success_replacing_a_failure_moves_its_shards_count() {
    let stack = Stack::new().await;
    stack.put_job(JOB, "active").await;
    stack
        .put_sharded_run((JOB, RUN), &["t1".into(), "t2".into()], (4, 0))
        .await;
    let key = processing_task(&stack).await;

    let sharding = Sharding {
        shards: 4,
        groups: 0,
    };
    converging_counted(&stack, Counting::Shards(sharding), async |stores| {
        fail_then_succeed(stores, &key).await;
    })
    .await;

    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(stack.run_counters(JOB, RUN).await, (1, 0, 1));
    assert_eq!(stack.run_item(JOB, RUN).await.status(), Some("running"));
}

/// Two tasks of a run counted in two shards of one group, the first shard's task failed.
async fn two_shards_one_group(stack: &Stack) -> (String, String, Sharding) {
    let sharding = Sharding {
        shards: 2,
        groups: 1,
    };
    let ids: Vec<String> = (1..20).map(|i| format!("t{i}")).collect();
    let in_shard = |s: u32| {
        ids.iter()
            .find(|id| sharding.shard_of(&task_ref(id).task_id) == s)
            .expect("one of 19 ids in each of two shards")
            .clone()
    };
    let (reopened, last) = (in_shard(0), in_shard(1));
    stack.put_job(JOB, "active").await;
    stack
        .put_sharded_run((JOB, RUN), &[reopened.clone(), last.clone()], (2, 1))
        .await;
    for id in [&reopened, &last] {
        stack
            .put_task(id, "http://site.example/a", "processing")
            .await;
    }
    (reopened, last, sharding)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_reopened_while_its_last_shard_counts_itself_done_keeps_the_run_open() {
    let stack = Stack::new().await;
    let (reopened, last, sharding) = two_shards_one_group(&stack).await;
    let counting = Counting::Shards(sharding);
    let key = |id: &str| conveyor_worker::domain::ids::ResultKey::for_task(PREFIX, &task_ref(id));
    converging_counted(&stack, counting, async |stores| {
        let (task, key) = (task_ref(&reopened), key(&reopened));
        let failed = stores.fail(&task, &key, not_found()).await;
        failed.expect("fail the first shard's task");
    })
    .await;
    // The last task's write: its shard (refused: the last), the shard's last with the
    // group's count (refused: the group's last too), then the group's last with the run's.
    // Just before that third transaction, an operator re-queues the failed task.
    let (pause, paused) = pause::PauseBefore::new("TransactWriteItems", 3);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config(&endpoint()).await)
        .interceptor(pause)
        .build();
    let tasks = DynamoTaskStore::new(aws_sdk_dynamodb::Client::from_conf(config), &stack.table);
    let results = stack.worker().results;
    let finishing = tokio::spawn(async move {
        converging_over((&tasks, &results), counting, async |stores| {
            let (task, key) = (task_ref(&last), key(&last));
            let failed = stores.fail(&task, &key, not_found()).await;
            failed.expect("fail the last task");
        })
        .await;
    });

    paused.reached().await;
    let (operator, task) = (stack.worker(), task_ref(&reopened));
    let requeued = operator.tasks.requeue_failed(&task, Some(counting)).await;
    requeued.expect("requeue");
    paused.resume();
    finishing.await.expect("the last task's write");

    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("running"), "a task is pending again");
    assert_eq!(run.n("times_completed"), None);
    assert_eq!(
        stack.counter_tree_faults(JOB, RUN).await,
        Vec::<String>::new()
    );
    converging_counted(&stack, counting, async |stores| {
        let (task, key) = (task_ref(&reopened), key(&reopened));
        let failed = stores.fail(&task, &key, not_found()).await;
        failed.expect("fail the re-queued task again");
    })
    .await;
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("times_completed"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_task_whose_count_was_refused_around_a_requeue_still_completes_its_run() {
    // Arrange: a run counted on its own item (v1) with two tasks: "a" failed, "b" the last.
    let stack = Stack::new().await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 2).await;
    for id in ["a", "b"] {
        stack
            .put_task(id, "http://site.example/a", "processing")
            .await;
    }
    let key = |id: &str| conveyor_worker::domain::ids::ResultKey::for_task(PREFIX, &task_ref(id));
    converging_counted(&stack, Counting::Run, async |stores| {
        let failed = stores.fail(&task_ref("a"), &key("a"), not_found()).await;
        failed.expect("fail a");
    })
    .await;
    // b's write: Count (refused: the last), then CountAndComplete. Before that second
    // transaction an operator re-queues "a" (2 left, so it is refused too); before the third,
    // "a" fails again (1 left): the third must complete the run, not count it to 0 open.
    let (second, at_second) = pause::PauseBefore::new("TransactWriteItems", 2);
    let (third, at_third) = pause::PauseBefore::new("TransactWriteItems", 3);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config(&endpoint()).await)
        .interceptor(second)
        .interceptor(third)
        .build();
    let tasks = DynamoTaskStore::new(aws_sdk_dynamodb::Client::from_conf(config), &stack.table);
    let results = stack.worker().results;
    let finishing = tokio::spawn(async move {
        converging_over((&tasks, &results), Counting::Run, async |stores| {
            let failed = stores.fail(&task_ref("b"), &key("b"), not_found()).await;
            failed.expect("fail the last task");
        })
        .await;
    });

    // Act
    at_second.reached().await;
    let operator = stack.worker();
    let requeued = operator
        .tasks
        .requeue_failed(&task_ref("a"), Some(Counting::Run))
        .await;
    requeued.expect("requeue a");
    at_second.resume();
    at_third.reached().await;
    converging_counted(&stack, Counting::Run, async |stores| {
        let failed = stores.fail(&task_ref("a"), &key("a"), not_found()).await;
        failed.expect("fail the re-queued task again");
    })
    .await;
    at_third.resume();
    finishing.await.expect("the last task's write");

    // Assert: both tasks ended, none left, and the run completed once.
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("tasks_remaining"), Some(0));
    assert_eq!(run.n("tasks_failed"), Some(2));
    assert_eq!(run.status(), Some("completed"), "{run:?}");
    assert_eq!(run.n("times_completed"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_back_never_lowers_a_slowdown_another_sandbox_raised_between_its_read_and_write() {
    use conveyor_worker::domain::health::Sign;
    use conveyor_worker::domain::limits::MAX_SLOWDOWN;

    // Arrange: a sandbox with a rate for its hosts takes a turn at `site.test`; its client
    // stops before its second UpdateItem (the first is the turn): the push-back's write.
    let stack = Stack::new().await;
    let (hosts, paused) = paused_before(&stack, "UpdateItem", 2).await;
    let (worker, permit, measures) = turn_at_site_test(&stack, &hosts, 1.0).await;
    let answer = Some(Sign::PushedBack(Some(30_000)));
    let sandbox = worker.clone();
    let answered = tokio::spawn(async move {
        let left = sandbox
            .gate
            .schedule
            .leave(&hosts, permit, answer, &measures);
        left.await;
    });

    // Act: between its read of the host and its write, another sandbox records a push-back
    // at the highest slowdown (with a shorter cooldown).
    paused.reached().await;
    let now = conveyor_worker::domain::time::epoch_millis(std::time::SystemTime::now());
    pushed_back(&stack, "site.test:80", (MAX_SLOWDOWN, now), now + 1_000).await;
    paused.resume();
    answered.await.expect("the push-back");

    // Assert: the higher slowdown stays; the longer cooldown is recorded.
    let host = stack.host_item("site.test:80", "HOST").await;
    let slowdown: f64 = attributes::number(&host.0, "slowdown").expect("a slowdown");
    assert_eq!(slowdown, MAX_SLOWDOWN, "{host:?}");
    let cooldown = host.n("cooldown_until").expect("a cooldown") as u128;
    assert!(cooldown >= now + 29_000, "{cooldown} against {now}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_asked_again_after_a_missed_one_is_held_by_a_push_back_recorded_before_it() {
    use conveyor_worker::domain::time::epoch_millis;

    // Arrange: a sandbox at one fetch every 2 s takes an idle host's turn and comes to it
    // 1.2 s late (its claim took that long; over half an interval is a miss), so it asks the
    // schedule again and is given the next start, 2 s after the first: far enough ahead to be
    // checked however slow a loaded machine is. Its client stops before its second GetItem:
    // the check there.
    let stack = Stack::new().await;
    let (hosts, paused) = paused_before(&stack, "GetItem", 2).await;
    let (worker, permit, measures) = turn_at_site_test(&stack, &hosts, 0.5).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let ends = std::time::Instant::now() + Duration::from_secs(10);
    let sandbox = worker.clone();
    let ready = tokio::spawn(async move {
        sandbox
            .gate
            .schedule
            .ready(&hosts, permit, ends, &measures)
            .await
    });

    // Act: before that check, another sandbox records a push-back with a 2 s cooldown.
    paused.reached().await;
    let now = epoch_millis(std::time::SystemTime::now());
    pushed_back(&stack, "site.test:80", (2.0, now), now + 2_000).await;
    paused.resume();

    // Assert: no fetch starts; the record comes back after the cooldown.
    let ready = ready.await.expect("the check").expect("the host's item");
    let Err(later) = ready else {
        panic!("a fetch started after a push-back was recorded");
    };
    assert!(later.delay >= Duration::from_millis(1_500), "{later:?}");
}

/// A sandbox whose hosts have `max_rps` (and 2 s of sleep toward a start), with the turn it
/// took through `hosts` at an idle `site.test`, and its measures.
async fn turn_at_site_test(
    stack: &Stack,
    hosts: &DynamoTaskStore,
    max_rps: f64,
) -> (
    std::sync::Arc<TestWorker>,
    conveyor_worker::polite::Permit,
    conveyor_worker::metrics::Measures,
) {
    use conveyor_worker::domain::limits::HostLimits;
    use conveyor_worker::polite::{Entry, GatePorts, JobPoliteness, Politeness, Visit};

    let worker = std::sync::Arc::new(stack.worker_with(|t| {
        t.politeness = Politeness {
            limits: HostLimits {
                max_rps: Some(max_rps),
                max_inflight: None,
            },
            max_sleep: Duration::from_secs(2),
            ..Politeness::off()
        };
    }));
    let visit = Visit {
        url: "http://site.test/page",
        booked: None,
        booked_at: None,
        wait_left: Duration::from_secs(60),
        booker: None,
        books: true,
    };
    let (job, measures) = (JobPoliteness::default(), Default::default());
    let fetch_time = Duration::from_secs(10);
    let ports = GatePorts {
        store: hosts,
        fetcher: &worker.fetcher,
    };
    let entered = (worker.gate).enter(ports, visit, &job, fetch_time, &measures);
    let Entry::Go(permit) = entered.await.expect("the host's turn") else {
        panic!("an idle host grants a turn at once");
    };
    (worker, permit, measures)
}

/// A push-back another sandbox recorded at `host`: `(slowdown, at)`, and a cooldown `until`.
async fn pushed_back(stack: &Stack, host: &str, (slowdown, at): (f64, u128), until: u128) {
    let update = stack
        .dynamodb
        .update_item()
        .table_name(&stack.table)
        .set_key(Some(keys::host_key(host, "HOST")))
        .update_expression("SET cooldown_until = :c, slowdown = :s, slowdown_at = :at")
        .expression_attribute_values(":c", attributes::n(until))
        .expression_attribute_values(":s", attributes::n(slowdown))
        .expression_attribute_values(":at", attributes::n(at));
    update.send().await.expect("the other sandbox's push-back");
}

/// A task store whose client stops before its `nth` request of `operation`.
async fn paused_before(
    stack: &Stack,
    operation: &'static str,
    nth: usize,
) -> (DynamoTaskStore, pause::Paused) {
    let (pause, paused) = pause::PauseBefore::new(operation, nth);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk_config(&endpoint()).await)
        .interceptor(pause)
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    (DynamoTaskStore::new(client, &stack.table), paused)
}
