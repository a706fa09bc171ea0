//! Run progress, counted exactly once: the terminal write and the run's counters change in
//! one transaction, and the last task completes the run, whoever delivers what how often.

use conveyor_testkit::*;
use conveyor_worker::store::{attributes, keys};
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

    // Every task delivered three times at once, then once more after it finished.
    let batches = workers
        .iter()
        .map(|w| run_batch(w, tasks.iter().map(|t| delivery(t)).collect()));
    let replies = join_all(batches).await;
    let late = run_batch(&workers[0], tasks.iter().map(|t| delivery(t)).collect()).await;

    assert!(replies.iter().chain([&late]).all(|r| retried(r).is_empty()));
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
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
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
