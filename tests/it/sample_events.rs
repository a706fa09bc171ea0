//! The sample events in `events/` (the ones `cargo lambda invoke --data-file` takes) get the
//! replies the ack contract promises, on the same seeded data as `make run`.

use aws_lambda_events::event::sqs::SqsEvent;
use conveyor_testkit::demo;
use conveyor_testkit::*;

#[tokio::test]
async fn every_sample_event_gets_the_reply_the_contract_promises() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    demo::seed(&stack, &site).await;
    let worker = stack.worker();
    let files = demo::event_files().expect("events/ is readable");
    assert!(
        files.len() >= 9,
        "one event per contract row plus a mixed batch"
    );

    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let event: SqsEvent = serde_json::from_str(&text).expect("an SQS event");
        assert!(!event.records.is_empty(), "{}", file.display());

        let reply = run_batch(&worker, event.records.clone()).await;

        let expected: Vec<_> = event
            .records
            .iter()
            .filter_map(|r| r.message_id.clone())
            .filter(|id| demo::RETRIED.contains(&id.as_str()))
            .collect();
        assert_eq!(retried(&reply), expected, "{}", file.display());
    }
    let wrong = demo::ended_otherwise(&stack, demo::TASKS).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test]
async fn the_local_stack_resets_to_the_seeded_data_for_the_sample_events_again() {
    // `make stack`: invoke by hand, then put everything back and invoke again.
    let (stack, site) = (Stack::new().await, Site::start().await);
    demo::seed(&stack, &site).await;
    let event: SqsEvent = serde_json::from_str(
        &std::fs::read_to_string(&demo::event_files().expect("events/")[0]).expect("readable"),
    )
    .expect("an SQS event");
    run_batch(&stack.worker(), event.records.clone()).await;

    demo::reset(&stack, &site).await;

    let task = stack.task_in(demo::JOB, demo::RUN, "pending-page").await;
    assert_eq!(task.status(), Some("pending"));
    assert_eq!(task.n("attempts"), None);
    let key = format!("{PREFIX}{}/{}/pending-page", demo::JOB, demo::RUN);
    assert!(
        stack.object(&key).await.is_none(),
        "stored objects are gone"
    );
    let again = run_batch(&stack.worker(), event.records).await;
    assert!(retried(&again).is_empty());
    let task = stack.task_in(demo::JOB, demo::RUN, "pending-page").await;
    assert_eq!(task.status(), Some("successful"));
}
