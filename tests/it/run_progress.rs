//! Run progress, counted exactly once: the terminal write and the run's counters change in
//! one transaction, and the last task completes the run, whoever delivers what how often.

use std::time::Duration;

use conveyor_testkit::*;
use conveyor_worker::domain::ids::TaskRef;
use conveyor_worker::store::dynamo::{attributes, keys};
use futures_util::future::join_all;

#[tokio::test]
async fn every_task_is_counted_once_and_the_last_one_completes_the_run() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 4).await;
    stack
        .put_task("ok-1", &site.url("/varying/ok-1"), "pending")
        .await;
    stack
        .put_task("ok-2", &site.url("/varying/ok-2"), "pending")
        .await;
    stack
        .put_task("ok-3", &site.url("/page/ok-3"), "pending")
        .await;
    stack
        .put_task("gone", &site.url("/status/404"), "pending")
        .await;
    let tasks = ["ok-1", "ok-2", "ok-3", "gone"];
    let workers: Vec<_> = (0..3).map(|_| stack.worker()).collect();

    let all_acked = delivered_by_every_worker_at_once_then_again(&workers, &tasks).await;

    assert!(all_acked);
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("tasks_remaining"), Some(0));
    assert_eq!(run.n("tasks_succeeded"), Some(3));
    assert_eq!(run.n("tasks_failed"), Some(1));
    assert_eq!(run.n("tasks_total"), Some(4));
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("times_completed"), Some(1));
    assert!(run.s("completed_at").is_some_and(|t| t.ends_with('Z')));
}

#[tokio::test]
async fn a_run_completes_only_when_its_last_task_ends() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 2).await;
    stack
        .put_task("first", &site.url("/page/first"), "pending")
        .await;
    stack
        .put_task("second", &site.url("/status/503"), "pending")
        .await;
    let worker = stack.worker();

    let reply = run_batch(&worker, vec![delivery("first"), delivery("second")]).await;

    assert_eq!(retried(&reply), ["second"]);
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("tasks_remaining"), Some(1));
    assert_eq!(run.status(), Some("running"));

    let final_try = record("second", &body("second"), MAX_ATTEMPTS);
    let reply = run_batch(&worker, vec![final_try]).await;

    assert!(retried(&reply).is_empty());
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("tasks_remaining"), Some(0));
    assert_eq!(
        (run.n("tasks_succeeded"), run.n("tasks_failed")),
        (Some(1), Some(1))
    );
    assert_eq!(run.status(), Some("completed"));
}

#[tokio::test]
async fn a_run_cancelled_mid_scrape_counts_its_task_but_stays_cancelled() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 1).await;
    stack
        .put_task("t1", &site.url("/slow/600"), "pending")
        .await;
    let worker = stack.worker();

    let (reply, ()) = tokio::join!(run_batch(&worker, vec![delivery("t1")]), async {
        // Once the page is being fetched (a fixed sleep raced the guard on a loaded machine).
        while site.hits("/slow/600") == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        stack
            .dynamodb
            .update_item()
            .table_name(&stack.table)
            .set_key(Some(keys::run_key(&id(JOB), &id(RUN))))
            .update_expression("SET #s = :c")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":c", attributes::s("cancelled"))
            .send()
            .await
            .expect("cancel the run");
    });

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("cancelled"));
    assert_eq!(run.n("tasks_remaining"), Some(0));
    assert_eq!(run.n("tasks_succeeded"), Some(1));
}

/// A job with a running run counted in `counters` (shards, groups) over `n` tasks (`t00`...),
/// each a fine page but every fifth, gone (404); the task ids.
async fn sharded_run(stack: &Stack, site: &Site, n: usize, counters: (u32, u32)) -> Vec<String> {
    let tasks: Vec<String> = (0..n).map(|i| format!("t{i:02}")).collect();
    stack.put_job(JOB, "active").await;
    stack.put_sharded_run((JOB, RUN), &tasks, counters).await;
    for (i, task) in tasks.iter().enumerate() {
        let page = if i % 5 == 4 {
            "/status/404".into()
        } else {
            format!("/page/{task}")
        };
        stack.put_task(task, &site.url(&page), "pending").await;
    }
    tasks
}

#[tokio::test]
async fn a_sharded_run_counts_every_task_once_and_its_last_shard_completes_it_once() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let tasks = sharded_run(&stack, &site, 24, (6, 2)).await;
    let workers: Vec<_> = (0..3).map(|_| stack.worker()).collect();

    let all_acked = delivered_by_every_worker_at_once_then_again(&workers, &tasks).await;

    assert!(all_acked);
    assert_eq!(stack.run_counters(JOB, RUN).await, (20, 4, 0));
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("completed"));
    assert_eq!(run.n("times_completed"), Some(1));
    assert_eq!(run.n("groups_remaining"), Some(0));
    assert_eq!(
        run.n("tasks_remaining"),
        None,
        "the run item counts groups, not tasks"
    );
    assert_eq!(
        stack.counter_tree_faults(JOB, RUN).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_sharded_run_completes_only_with_its_last_task_whichever_shard_it_is_in() {
    for (counters, left) in [((3, 0), "shards_remaining"), ((4, 2), "groups_remaining")] {
        let (stack, site) = (Stack::new().await, Site::start().await);
        let tasks = sharded_run(&stack, &site, 12, counters).await;
        let (last, first) = tasks.split_last().expect("tasks");

        run_batch(&stack.worker(), first.iter().map(|t| delivery(t)).collect()).await;
        let before = stack.run_item(JOB, RUN).await;
        run_batch(&stack.worker(), vec![delivery(last)]).await;

        assert_eq!(before.status(), Some("running"), "{counters:?}");
        assert_eq!(before.n(left), Some(1), "{counters:?}");
        let run = stack.run_item(JOB, RUN).await;
        assert_eq!(run.status(), Some("completed"), "{counters:?}");
        assert_eq!(run.n("times_completed"), Some(1), "{counters:?}");
        assert_eq!(stack.run_counters(JOB, RUN).await, (10, 2, 0));
    }
}

/// A worker whose parents cache keeps a run for the whole test: the tests that count what
/// is read within the cache's time must not see it lapse (5 s by default) on a loaded
/// machine, where one batch against the emulator can take seconds.
fn cached_worker(stack: &Stack) -> TestWorker {
    stack.worker_with(|t| t.parents_ttl = Duration::from_secs(600))
}

#[tokio::test]
async fn a_sharded_run_cancelled_midway_counts_its_tasks_but_stays_cancelled() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let tasks = sharded_run(&stack, &site, 6, (2, 0)).await;
    let worker = cached_worker(&stack);
    run_batch(&worker, vec![delivery(&tasks[0])]).await; // the run is wanted: kept
    stack.put_run(JOB, RUN, "cancelled").await;

    let replies = run_batch(&worker, tasks[1..].iter().map(|t| delivery(t)).collect()).await;

    // Seen within the parents cache's time: counted, the run not completed.
    assert!(retried(&replies).is_empty());
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.status(), Some("cancelled"));
    assert_eq!(run.n("times_completed"), None);
}

#[tokio::test]
async fn a_run_is_read_once_per_worker_while_it_is_wanted_and_again_when_it_was_not() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    for task in ["a", "b", "c"] {
        stack
            .put_task(task, &site.url(&format!("/page/{task}")), "pending")
            .await;
    }
    let worker = cached_worker(&stack);

    // No run yet: not wanted, and not kept as such.
    let early = run_batch(&worker, vec![delivery("a")]).await;
    stack.put_counted_run(JOB, RUN, 3).await;
    stack.calls.clear();
    run_batch(&worker, vec![delivery("b"), delivery("c")]).await;
    run_batch(&worker, vec![delivery("a")]).await;

    assert!(retried(&early).is_empty(), "acked as not wanted");
    assert_eq!(
        stack.calls.count("BatchGetItem"),
        1,
        "{:?}",
        stack.calls.calls()
    );
    assert_eq!(stack.run_counters(JOB, RUN).await, (3, 0, 0));
}

#[tokio::test]
async fn a_sharded_run_costs_no_more_requests_per_task_and_a_kept_run_one_fewer() {
    // Three tasks in one shard: the last of them is the shard's and the run's last.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let tasks = sharded_run(&stack, &site, 3, (1, 0)).await;
    let worker = cached_worker(&stack);
    let mut calls = Vec::new();

    for task in &tasks {
        stack.calls.clear();
        run_batch(&worker, vec![delivery(task)]).await;
        calls.push(stack.calls.calls());
    }

    let [first, kept, last] = calls.try_into().expect("three tasks");
    assert_eq!(
        first,
        [
            "GetItem",
            "BatchGetItem",
            "UpdateItem",
            "PutObject",
            "TransactWriteItems"
        ],
        "five, as in a run without shards"
    );
    assert_eq!(
        kept,
        ["GetItem", "UpdateItem", "PutObject", "TransactWriteItems"],
        "the run read within the cache's time is not read again"
    );
    // The run's last: counting refused (the shard's last), then the run (its last shard).
    assert_eq!(
        last,
        ["GetItem", "UpdateItem", "PutObject"]
            .into_iter()
            .chain(["TransactWriteItems"; 3])
            .collect::<Vec<_>>()
    );
    assert_eq!(stack.run_item(JOB, RUN).await.status(), Some("completed"));
}

/// Every task delivered by every worker at once (a batch each), then once more after it
/// finished; whether every delivery was acknowledged.
async fn delivered_by_every_worker_at_once_then_again<T: AsRef<str>>(
    workers: &[TestWorker],
    tasks: &[T],
) -> bool {
    let batch = || tasks.iter().map(|t| delivery(t.as_ref())).collect();
    let replies = join_all(workers.iter().map(|w| run_batch(w, batch()))).await;
    let late = run_batch(&workers[0], batch()).await;
    replies.iter().chain([&late]).all(|r| retried(r).is_empty())
}

/// A v3 run of `n` tasks (`t00`...) spread over `shards` in `groups`, each a fine page but
/// every fifth, gone (404); the tasks as their messages name them.
async fn spread_run(
    stack: &Stack,
    site: &Site,
    n: usize,
    (shards, groups): (u32, u32),
) -> Vec<TaskRef> {
    let ids: Vec<String> = (0..n).map(|i| format!("t{i:02}")).collect();
    stack.put_job(JOB, "active").await;
    stack
        .put_spread_run((JOB, RUN), &ids, (shards, groups))
        .await;
    let mut tasks = Vec::new();
    for (i, task) in ids.iter().enumerate() {
        let page = if i % 5 == 4 {
            "/status/404".into()
        } else {
            format!("/page/{task}")
        };
        let task = task_ref(task).spread_over(Some(shards));
        stack.put_task_of(&task, &site.url(&page), "pending").await;
        tasks.push(task);
    }
    tasks
}

#[tokio::test]
async fn a_spread_run_delivered_twice_to_two_sandboxes_counts_every_task_once_and_completes_once() {
    // Arrange: a v3 run behind the production-like layer (transactions that overlap are
    // cancelled, S3's racing conditional PUTs get 409).
    let (stack, site) = (Stack::prodlike().await, Site::start().await);
    let tasks = spread_run(&stack, &site, 40, (8, 2)).await;
    let workers: Vec<_> = (0..2).map(|_| stack.worker()).collect();
    let batch = || -> Vec<_> {
        let body = |t: &TaskRef| conveyor_worker::domain::message::body(t);
        tasks
            .iter()
            .map(|t| record(t.task_id.as_str(), &body(t), 1))
            .collect()
    };

    // Act: every task to both sandboxes at once, then once more; what they retried (the
    // layer cancels overlapping transactions) is delivered again, as the queue would.
    join_all(workers.iter().map(|w| run_batch(w, batch()))).await;
    let mut retried_ids = retried(&run_batch(&workers[0], batch()).await);
    for _ in 0..5 {
        if retried_ids.is_empty() {
            break;
        }
        let again: Vec<_> = batch()
            .into_iter()
            .filter(|r| {
                retried_ids
                    .iter()
                    .any(|id| Some(id.as_str()) == r.message_id.as_deref())
            })
            .collect();
        retried_ids = retried(&run_batch(&workers[1], again).await);
    }

    // Assert: all ended; the counters are the tasks' states; one completion; each task's
    // item under its shard's partition and its page under its spread prefix.
    assert!(retried_ids.is_empty(), "still retried: {retried_ids:?}");
    assert_eq!(stack.run_counters(JOB, RUN).await, (32, 8, 0));
    let listed = stack.tasks_in_run(JOB, RUN).await;
    let ended = |status| {
        listed
            .iter()
            .filter(|(_, t)| t.status() == Some(status))
            .count()
    };
    assert_eq!(
        (listed.len(), ended("successful"), ended("failed")),
        (40, 32, 8)
    );
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(
        (run.status(), run.n("times_completed")),
        (Some("completed"), Some(1))
    );
    assert_eq!(
        stack.counter_tree_faults(JOB, RUN).await,
        Vec::<String>::new()
    );
    let partitions: std::collections::BTreeSet<_> = listed
        .iter()
        .filter_map(|(_, t)| t.s("pk").map(str::to_owned))
        .collect();
    assert!(
        partitions.len() > 1 && !partitions.contains(&format!("RUN#{JOB}#{RUN}")),
        "{partitions:?}"
    );
    let key = conveyor_worker::domain::ids::ResultKey::for_task(PREFIX, &tasks[0]);
    assert!(
        !key.as_str().starts_with(&format!("{PREFIX}{JOB}/")),
        "{}",
        key.as_str()
    );
    let object = stack
        .object(key.as_str())
        .await
        .expect("t00's page, stored");
    assert_eq!(
        listed[0].1.s("result_sha256"),
        Some(object.sha256().as_str())
    );
}

#[tokio::test]
async fn the_operator_lists_a_spread_run_by_one_query_a_shard_never_a_scan() {
    // Arrange
    let (stack, site) = (Stack::new().await, Site::start().await);
    spread_run(&stack, &site, 30, (6, 0)).await;
    let store = stack.worker().tasks;
    stack.calls.clear();

    // Act
    let listed = store
        .run_tasks(&id(JOB), &id(RUN))
        .await
        .expect("the run's tasks");

    // Assert: all 30, in task order, read by the run item and a Query per shard.
    let ids: Vec<&str> = listed.iter().map(|(task, _)| task.as_str()).collect();
    let expected: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    assert_eq!(ids, expected);
    assert_eq!(stack.calls.count("Scan"), 0);
    assert_eq!(stack.calls.count("Query"), 6);
}
