//! Retry timing against the emulator's SQS: a transiently failed message is held back for
//! as long as the site asked, or for a backoff that grows with every receive; when holding
//! it back fails, it is still retried. The bounds are the holds the worker set, and that SQS
//! gave nothing back before them: a slow machine only comes back later. (Our own AWS errors
//! get holds of their own: `tests/it/ack_contract.rs` and `tests/it/production.rs`.)

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;

/// A queue whose own visibility timeout (30 s) is far longer than any hold in these tests,
/// so a message that comes back early or on time came back because the worker said so.
async fn queue(stack: &Stack) -> Queue {
    Queue::create(stack, 30).await
}

fn receives(message: &SqsMessage) -> &str {
    message.attributes["ApproximateReceiveCount"].as_str()
}

#[tokio::test]
async fn a_429_with_retry_after_comes_back_after_the_wait_and_not_before() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/retry-after/2"), "pending")
        .await;
    let queue = queue(&stack).await;
    queue.send(&stack, &body("t1")).await;
    let first = queue.receive(&stack).await.expect("the first delivery");

    let reply = run_batch(&stack.worker(), vec![first.clone()]).await;

    assert_eq!(
        retried(&reply),
        [first.message_id.clone().unwrap_or_default()]
    );
    assert_eq!(stack.calls.count("ChangeMessageVisibility"), 1);
    let (again, after) = queue
        .wait_for_redelivery(&stack, Duration::from_secs(8))
        .await;
    assert_eq!(stack.calls.holds(), [2], "held for the 2 s the site asked");
    assert!(
        after >= Duration::from_millis(1500),
        "back after {after:?}, asked for 2 s"
    );
    assert_eq!(receives(&again), "2");
}

#[tokio::test]
async fn a_503_backs_off_longer_on_every_receive() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/status/503"), "pending")
        .await;
    let queue = queue(&stack).await;
    queue.send(&stack, &body("t1")).await;
    let worker = stack.worker(); // backoff: 1 s doubling, jitter at its ceiling
    let mut message = queue.receive(&stack).await.expect("the first delivery");
    let mut waits = Vec::new();

    for _ in 0..2 {
        let reply = run_batch(&worker, vec![message.clone()]).await;
        assert_eq!(retried(&reply).len(), 1);
        let (again, after) = queue
            .wait_for_redelivery(&stack, Duration::from_secs(10))
            .await;
        waits.push(after);
        message = again;
    }

    let [first, second] = waits[..] else {
        unreachable!("two waits")
    };
    assert_eq!(stack.calls.holds(), [1, 2], "1 s doubling: {waits:?}");
    assert!(first >= Duration::from_millis(700), "{waits:?}");
    assert!(second >= Duration::from_millis(1_700), "{waits:?}");
    assert_eq!(receives(&message), "3");
    assert_eq!(stack.task("t1").await.status(), Some("processing"));
}

#[tokio::test]
async fn a_failed_hold_back_still_reports_the_record_for_retry() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/status/503"), "pending")
        .await;
    // The record names a queue that does not exist: ChangeMessageVisibility fails.
    let record = record("m1", &body("t1"), 1);

    let reply = run_batch(&stack.worker(), vec![record]).await;

    assert_eq!(retried(&reply), ["m1"]);
    assert_eq!(stack.calls.count("ChangeMessageVisibility"), 1);
}
