//! The renderer as its Lambda function runs it: the worker's pipeline (proxy, claim,
//! converge, the ack contract) against the emulator, with politeness at its production
//! defaults and the browser as the fetcher. A client-rendered page is stored with the text
//! its script fetched, counted once under a duplicate delivery; a page the site fails is
//! retried, and fails with its status on its last attempt.

use std::sync::Arc;

use conveyor_renderer::fetcher::{BrowserFetcher, RENDERED_TYPE};
use conveyor_testkit::app_site::rendered_text;
use conveyor_testkit::*;
use conveyor_worker::Config;
use conveyor_worker::polite::Politeness;
use conveyor_worker::scraper::HttpFetcher;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::SqsVisibility;
use conveyor_worker::worker::Worker;

use crate::renderer::browser::settings;

type Renderer = Worker<DynamoTaskStore, S3ResultStore, BrowserFetcher, SqsVisibility>;

/// Politeness as deployed: the configuration's defaults.
fn production_politeness() -> Politeness {
    let required =
        |name: &str| matches!(name, "TABLE_NAME" | "RESULTS_BUCKET").then(|| "required".into());
    Config::from_lookup(required)
        .expect("the defaults")
        .politeness
}

fn renderer(stack: &Stack, tune: impl FnOnce(&mut WorkerTuning)) -> Renderer {
    let tune = |tuning: &mut WorkerTuning| {
        tuning.politeness = production_politeness();
        tune(tuning);
    };
    stack.worker_fetching(tune, |_, (fetch, policy, lookup)| {
        let plain = HttpFetcher::with_policy(&fetch, policy.clone(), Arc::clone(&lookup))
            .expect("a client");
        BrowserFetcher::new(plain, (policy, lookup), settings())
    })
}

#[tokio::test]
async fn a_client_rendered_page_is_stored_rendered_and_counted_once_under_a_duplicate_delivery() {
    // Arrange: two app pages of one host, the first delivered twice in the batch.
    let stack = Stack::new().await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 2).await;
    let mut sites = Vec::new();
    for name in ["shop", "cart"] {
        let site = Site::start().await;
        stack
            .put_task(name, &site.url(&format!("/app/{name}")), "pending")
            .await;
        sites.push(site);
    }
    let worker = renderer(&stack, |_| {});

    // Act
    let records = vec![delivery("shop"), delivery("cart"), delivery("shop")];
    let reply = run_batch(&worker, records).await;

    // Assert
    assert!(retried(&reply).is_empty(), "{reply:?}");
    for name in ["shop", "cart"] {
        let task = stack.task(name).await;
        assert_eq!(task.status(), Some("successful"), "{name}: {task:?}");
        let key = task.s("result_key").expect("a result key").to_owned();
        let object = stack.object(&key).await.expect("the stored object");
        let html = String::from_utf8_lossy(&object.body);
        assert!(html.contains(&rendered_text(name)), "{name}: {html}");
        assert_eq!(object.content_type, RENDERED_TYPE);
        assert_eq!(
            task.0.get("rendered").map(|v| v.as_bool().copied()),
            Some(Ok(true))
        );
        let rendering = object.metadata.get("rendered").expect("the object says so");
        assert!(rendering.starts_with("requests=2 bytes="), "{rendering}");
    }
    assert_eq!(stack.run_counters(JOB, RUN).await, (2, 0, 0));
}

#[tokio::test]
async fn a_page_the_site_fails_is_retried_then_fails_with_its_status_on_its_last_attempt() {
    // Arrange: two pages whose documents answer 503, each on a host of its own (a 503
    // slows its host down, and the second would wait for it).
    let stack = Stack::new().await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 2).await;
    let (early, last) = (Site::start().await, Site::start().await);
    stack
        .put_task("early", &early.url("/status/503"), "pending")
        .await;
    stack
        .put_task("last", &last.url("/status/503"), "pending")
        .await;
    let worker = renderer(&stack, |_| {});

    // Act: a first delivery of one, the fifth (MAX_ATTEMPTS) of the other.
    let records = vec![delivery("early"), record("last", &body("last"), 5)];
    let reply = run_batch(&worker, records).await;

    // Assert: the first retried; the last failed with the site's status, counted once.
    assert_eq!(retried(&reply), vec!["early".to_owned()]);
    let task = stack.task("last").await;
    assert_eq!(task.status(), Some("failed"), "{task:?}");
    assert_eq!(task.s("error"), Some("HTTP 503"));
    assert_eq!(stack.run_counters(JOB, RUN).await, (0, 1, 1));
}

#[tokio::test]
async fn every_renderer_sample_event_gets_the_reply_the_contract_promises() {
    // Arrange: the demo's data, as `make run` and `cargo lambda invoke` use it, at the test
    // pace the worker's sample events run at (its pages share one host).
    let (stack, site) = (Stack::new().await, Site::start().await);
    demo::seed(&stack, &site).await;
    let worker = renderer(&stack, |t| {
        t.politeness = WorkerTuning::default().politeness
    });
    let files = demo::render_event_files().expect("events/renderer/ is readable");
    assert!(files.len() >= 2, "a page, and a mixed batch");

    // Act and assert: no record of them is retried.
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let event: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_str(&text).expect("an SQS event");
        let reply = run_batch(&worker, event.records).await;
        assert!(retried(&reply).is_empty(), "{}: {reply:?}", file.display());
    }
    for seed in demo::RENDERED {
        let task = stack.task_in(seed.job, seed.run, seed.task).await;
        assert_eq!(
            task.status(),
            Some(seed.ends),
            "{}: {}",
            seed.task,
            seed.row
        );
    }
    let page = stack.task_in(demo::JOB, demo::RENDER_RUN, "app-page").await;
    let key = page.s("result_key").expect("a result key").to_owned();
    let object = stack.object(&key).await.expect("the stored page");
    assert!(String::from_utf8_lossy(&object.body).contains(&rendered_text("demo")));
}
