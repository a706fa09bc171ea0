//! Duplicates and races end to end: however deliveries interleave, the task ends once and
//! its record describes the object that is actually stored. moto runs one request at a time
//! (scripts/moto_server.py), so these exercise the worker's conditions, not moto's races.

mod support;

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use conveyor_worker::config::DuplicatePolicy;
use futures_util::future::join_all;
use support::*;

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
        // Another delivery finishes the task while this one is still fetching.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stack
            .dynamodb
            .update_item()
            .table_name(&stack.table)
            .key("pk", AttributeValue::S(format!("RUN#{JOB}#{RUN}")))
            .key("sk", AttributeValue::S("TASK#t1".into()))
            .update_expression("SET #s = :failed, #e = :why")
            .expression_attribute_names("#s", "status")
            .expression_attribute_names("#e", "error")
            .expression_attribute_values(":failed", AttributeValue::S("failed".into()))
            .expression_attribute_values(":why", AttributeValue::S("the other delivery".into()))
            .send()
            .await
            .expect("finish the task as the other delivery");
    });

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("failed"));
    assert_eq!(task.s("error"), Some("the other delivery"));
    assert!(task.s("result_key").is_none());
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

async fn set_lease(stack: &Stack, task: &str, owner: &str, until: std::time::SystemTime) {
    let millis = until
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    stack
        .dynamodb
        .update_item()
        .table_name(&stack.table)
        .key("pk", AttributeValue::S(format!("RUN#{JOB}#{RUN}")))
        .key("sk", AttributeValue::S(format!("TASK#{task}")))
        .update_expression("SET lease_owner = :o, lease_until = :u")
        .expression_attribute_values(":o", AttributeValue::S(owner.into()))
        .expression_attribute_values(":u", AttributeValue::N(millis.to_string()))
        .send()
        .await
        .expect("set a lease");
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
    set_lease(&stack, "t1", "another-invocation", later).await;

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
    set_lease(&stack, "t1", "a-crashed-invocation", earlier).await;

    let reply = run_batch(&lease_worker(&stack), vec![record("m1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(site.hits("/page/a"), 1);
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
}
