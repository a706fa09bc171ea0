//! One trace per task: each delivery continues the producer's `AWSTraceHeader`, every copy
//! the worker sends carries it on, each step has its span, nothing secret is in any span,
//! and a collector that is down or slow changes no outcome.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_sqs::types::{MessageSystemAttributeNameForSends, MessageSystemAttributeValue};
use conveyor_testkit::forward_proxy::{self, ForwardProxy};
use conveyor_testkit::otlp::{Mode, Receiver};
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::domain::proxy::{ProxySecret, Tiers};
use conveyor_worker::trace;
use conveyor_worker::wiring::config::TraceSettings;
use conveyor_worker::wiring::traces::{self, Traces};
use serde_json::Value;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

use crate::polite_defaults::production_defaults;

const DATACENTER: [u8; 4] = [127, 0, 0, 3];
const RESIDENTIAL: [u8; 4] = [127, 0, 0, 4];
/// A key in the task's URL, which no span may show.
const URL_KEY: &str = "key=url-secret-91c2";

/// A producer's trace header, as the X-Ray SDK writes it: sampled, with the time now.
fn producer_header() -> (String, String, String) {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    let seconds = now.expect("after 1970").as_secs();
    let trace = format!("{seconds:08x}{:024x}", fastrand::u128(..) >> 32);
    let parent = format!("{:016x}", fastrand::u64(1..));
    let header = format!(
        "Root=1-{}-{};Parent={parent};Sampled=1",
        &trace[..8],
        &trace[8..]
    );
    (header, trace, parent)
}

/// Sends `task`'s message with the producer's trace header, as a traced producer does.
async fn send_traced(stack: &Stack, queue: &Queue, task: &str, header: &str) {
    let value = MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header)
        .build()
        .expect("a data type");
    let send = stack
        .sqs
        .send_message()
        .queue_url(&queue.url)
        .message_body(body(task));
    let send =
        send.message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, value);
    send.send().await.expect("send");
}

/// Exports to `receiver` for this thread (a test's runtime is this thread alone).
fn traced_to(receiver: &Receiver, rate: f64) -> (Traces, tracing::subscriber::DefaultGuard) {
    let settings = TraceSettings {
        on: true,
        sample_rate: rate,
        endpoint: receiver.endpoint.clone(),
        export_timeout: Duration::from_secs(2),
    };
    let traces = traces::exporter(&settings, "conveyor-worker-test").expect("an exporter");
    // Log lines too, shown when the test fails.
    let logs = tracing_subscriber::fmt::layer().with_test_writer();
    let subscriber = tracing_subscriber::registry()
        .with(traces.layer())
        .with(logs.with_filter(LevelFilter::INFO));
    let guard = tracing::subscriber::set_default(subscriber);
    trace::switch_on();
    (traces, guard)
}

/// The host waits `seconds` more before its next request, as a 429 elsewhere left it.
async fn cooling(stack: &Stack, host: &str, seconds: u64) {
    let until = SystemTime::now() + Duration::from_secs(seconds);
    let until = until
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    let mut item = conveyor_worker::store::dynamo::keys::host_key(host, "HOST");
    let until = conveyor_worker::store::dynamo::attributes::n(until.as_millis());
    item.insert("cooldown_until".into(), until);
    let put = stack
        .dynamodb
        .put_item()
        .table_name(&stack.table)
        .set_item(Some(item));
    put.send().await.expect("put the host item");
}

async fn next(stack: &Stack, queue: &Queue) -> SqsMessage {
    queue
        .wait_for_redelivery(stack, Duration::from_secs(20))
        .await
        .0
}

/// The spans of one delivery: its `record` span and every span under it.
fn under<'a>(spans: &'a [Value], record: &Value) -> Vec<&'a Value> {
    let mut ids = HashSet::from([record["span_id"].as_str().unwrap_or_default().to_owned()]);
    let mut found = Vec::new();
    loop {
        let more: Vec<&Value> = (spans.iter())
            .filter(|s| ids.contains(s["parent_span_id"].as_str().unwrap_or_default()))
            .filter(|s| s["name"] != "record" && !found.contains(s))
            .collect();
        if more.is_empty() {
            return found;
        }
        ids.extend(
            more.iter()
                .map(|s| s["span_id"].as_str().unwrap_or_default().to_owned()),
        );
        found.extend(more);
    }
}

fn names(spans: &[&Value]) -> HashMap<String, usize> {
    let mut names = HashMap::new();
    for span in spans {
        *names
            .entry(span["name"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    names
}

#[tokio::test]
async fn a_task_that_waits_twice_and_climbs_a_tier_is_one_trace_from_its_producer() {
    // Arrange: the datacenter tier gets a challenge page, the residential tier (with a
    // password) the page. The task's host cools down before each of its first two turns.
    let stack = Stack::new().await;
    let datacenter = ForwardProxy::start(DATACENTER.into(), true).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), true).await;
    stack.put_active_run().await;
    stack.set_paid_budget(10_000_000).await;
    let site = Site::start().await;
    let case = "cloudflare-challenge-header";
    let path = format!("/challenged/{}/{case}/{case}?{URL_KEY}", datacenter.egress);
    stack.put_task("t1", &site.url(&path), "pending").await;
    let queue = Queue::create(&stack, 30).await;
    let (header, trace_id, producer_span) = producer_header();
    send_traced(&stack, &queue, "t1", &header).await;
    let receiver = Receiver::start(Mode::Ok).await;
    let tiers = Tiers::parse(&[datacenter.url(), residential.url()].join(";")).expect("tiers");
    let secret =
        serde_json::json!({ "username": forward_proxy::USER, "password": forward_proxy::PASSWORD });
    let secret = ProxySecret::parse(&secret.to_string()).expect("a proxy secret");
    // Each delivery on a new sandbox, as copies land: it knows the host only from its item.
    let sandbox = || {
        stack.worker_with(|t| {
            t.politeness = production_defaults();
            t.proxies = tiers.clone();
            t.proxy_secret = secret.clone();
        })
    };
    // Sampled by the producer: the worker's own share (none here) is not asked.
    let (traces, _guard) = traced_to(&receiver, 0.0);

    // Act: two deliveries that wait for the host, then until the task ends.
    for delivery in 0.. {
        let record = next(&stack, &queue).await;
        if delivery < 2 {
            cooling(&stack, &site.addr.to_string(), 2).await;
        }
        run_batch(&sandbox(), vec![record]).await;
        if stack.task("t1").await.status() == Some("successful") || delivery == 5 {
            break;
        }
    }
    traces.flush();
    let (requests, spans) = receiver.spans().await;
    assert!(requests >= 1, "exported");

    // Assert: the task succeeded, each delivery a `record` span of the producer's trace,
    // each the child of the one before (the copies carried the trace), the first the
    // producer's child.
    let mut records: Vec<&Value> = (spans.iter())
        .filter(|s| s["name"] == "record" && s["attributes"]["task_id"] == "t1")
        .collect();
    records.sort_by_key(|s| s["start_unix_nano"].as_u64());
    let outcomes: Vec<&Value> = records
        .iter()
        .map(|r| &r["attributes"]["outcome"])
        .collect();
    assert_eq!(
        stack.task("t1").await.status(),
        Some("successful"),
        "{outcomes:?}"
    );
    assert_eq!(records.len(), 3, "{outcomes:?}");
    let mut parent = producer_span.clone();
    for record in &records {
        assert_eq!(record["trace_id"], trace_id.as_str());
        assert_eq!(record["parent_span_id"], parent.as_str());
        assert_eq!(record["attributes"]["job_id"], JOB);
        assert_eq!(record["attributes"]["run_id"], RUN);
        assert!(
            !record["links"].as_array().expect("links").is_empty(),
            "{record}"
        );
        parent = record["span_id"].as_str().expect("an id").to_owned();
    }
    let xray = format!("1-{}-{}", &trace_id[..8], &trace_id[8..]);
    assert_eq!(records[0]["attributes"]["trace_id"], xray.as_str());
    for waited in &records[..2] {
        assert_eq!(
            waited["attributes"]["outcome"], "polite_requeued",
            "{waited}"
        );
        let steps = names(&under(&spans, waited));
        for step in ["parse", "guard", "host_turn", "copy"] {
            assert!(steps.contains_key(step), "{step} in {steps:?}");
        }
    }
    let fetched = records[2];
    assert_eq!(fetched["attributes"]["outcome"], "succeeded");
    assert_eq!(fetched["attributes"]["reply"], "ack");
    assert_eq!(fetched["attributes"]["tier"], 2);
    assert_eq!(
        fetched["attributes"]["host"],
        site.addr.to_string().as_str()
    );
    let steps = under(&spans, fetched);
    let counted = names(&steps);
    for step in [
        "parse",
        "guard",
        "host_turn",
        "host_start",
        "fetch",
        "put_if_absent",
        "terminal_write",
    ] {
        assert!(counted.contains_key(step), "{step} in {counted:?}");
    }
    // The page's fetches (the free tiers, then the paid one), not robots.txt's.
    let robots: Vec<&Value> = steps
        .iter()
        .copied()
        .filter(|s| s["name"] == "robots")
        .collect();
    let page_fetches: Vec<&Value> = (steps.iter().copied())
        .filter(|s| s["name"] == "fetch")
        .filter(|s| !robots.iter().any(|r| r["span_id"] == s["parent_span_id"]))
        .collect();
    let mut hops: Vec<&&Value> = (steps.iter())
        .filter(|s| s["name"] == "hop")
        .filter(|s| {
            page_fetches
                .iter()
                .any(|f| f["span_id"] == s["parent_span_id"])
        })
        .collect();
    hops.sort_by_key(|s| s["start_unix_nano"].as_u64());
    assert_eq!(hops.len(), 2, "{hops:#?}");
    let (blocked, page) = (&hops[0]["attributes"], &hops[1]["attributes"]);
    assert_eq!(
        (blocked["tier"].as_i64(), blocked["blocked"].as_bool()),
        (Some(1), Some(true))
    );
    assert_eq!(blocked["error.class"], "failed_permanently");
    assert_eq!(
        hops[0]["status"]["code"], 2,
        "the span that met the block is an error"
    );
    assert_eq!(
        (page["tier"].as_i64(), page["status"].as_i64()),
        (Some(2), Some(200))
    );
    assert!(
        page["bytes"].as_i64() > Some(0) && page["first_byte_ms"].is_i64(),
        "{page}"
    );

    // Nothing from the page, the URL's query or the proxy's password in any span.
    let text = serde_json::to_string(&spans).expect("JSON");
    let body = conveyor_testkit::site::challenged_page(case);
    for secret in [
        forward_proxy::PASSWORD,
        URL_KEY,
        &body,
        "cf-mitigated",
        "Just a moment",
    ] {
        assert!(!text.contains(secret), "{secret} is in a span");
    }
}
