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
use conveyor_testkit::runtime_api::RuntimeApi;
use conveyor_testkit::scenario;
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
    trace::switch_on(rate);
    (traces, guard)
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

/// A task behind two proxy tiers: the datacenter tier gets a challenge page, the
/// residential tier (with a password) the page. Its message is on the queue, traced.
struct Climb {
    stack: Stack,
    site: Site,
    queue: Queue,
    proxies: [ForwardProxy; 2],
    producer: (String, String),
}

const CASE: &str = "cloudflare-challenge-header";

impl Climb {
    async fn arrange() -> Self {
        let stack = Stack::new().await;
        let datacenter = ForwardProxy::start(DATACENTER.into(), true).await;
        let residential = ForwardProxy::start(RESIDENTIAL.into(), true).await;
        stack.put_active_run().await;
        stack.set_paid_budget(10_000_000).await;
        let site = Site::start().await;
        let path = format!("/challenged/{}/{CASE}/{CASE}?{URL_KEY}", datacenter.egress);
        stack.put_task("t1", &site.url(&path), "pending").await;
        let queue = Queue::create(&stack, 30).await;
        let (header, trace_id, producer_span) = producer_header();
        send_traced(&stack, &queue, "t1", &header).await;
        let proxies = [datacenter, residential];
        let producer = (trace_id, producer_span);
        Self {
            stack,
            site,
            queue,
            proxies,
            producer,
        }
    }

    /// A new sandbox, as a copy lands on: it knows the host only from its item.
    fn sandbox(&self) -> TestWorker {
        let tiers = self
            .proxies
            .iter()
            .map(ForwardProxy::url)
            .collect::<Vec<_>>();
        let tiers = Tiers::parse(&tiers.join(";")).expect("tiers");
        let secret = serde_json::json!({ "username": forward_proxy::USER, "password": forward_proxy::PASSWORD });
        let secret = ProxySecret::parse(&secret.to_string()).expect("a proxy secret");
        self.stack.worker_with(|t| {
            t.politeness = production_defaults();
            (t.proxies, t.proxy_secret) = (tiers, secret);
        })
    }

    /// Two deliveries that wait for the host (cooling down), then until the task ends.
    async fn deliver_until_done(&self) {
        for delivery in 0..6 {
            let record = next(&self.stack, &self.queue).await;
            if delivery < 2 {
                self.stack.cool_host(&self.site.addr.to_string(), 2).await;
            }
            run_batch(&self.sandbox(), vec![record]).await;
            if self.stack.task("t1").await.status() == Some("successful") {
                return;
            }
        }
    }
}

/// The task's `record` spans in the order they started.
fn records_of<'a>(spans: &'a [Value], task: &str) -> Vec<&'a Value> {
    let mut records: Vec<&Value> = (spans.iter())
        .filter(|s| s["name"] == "record" && s["attributes"]["task_id"] == task)
        .collect();
    records.sort_by_key(|s| s["start_unix_nano"].as_u64());
    records
}

/// Each record in the producer's trace, each the child of the one before, the first the
/// producer's child, each linked to its invocation.
fn assert_one_chain(records: &[&Value], (trace_id, producer_span): &(String, String)) {
    let mut parent = producer_span.clone();
    for record in records {
        assert_eq!(record["trace_id"], trace_id.as_str());
        assert_eq!(record["parent_span_id"], parent.as_str());
        assert_eq!(
            (
                &record["attributes"]["job_id"],
                &record["attributes"]["run_id"]
            ),
            (&JOB.into(), &RUN.into())
        );
        assert!(
            !record["links"].as_array().expect("links").is_empty(),
            "{record}"
        );
        parent = record["span_id"].as_str().expect("an id").to_owned();
    }
    let xray = format!("1-{}-{}", &trace_id[..8], &trace_id[8..]);
    assert_eq!(records[0]["attributes"]["trace_id"], xray.as_str());
}

/// The hops of the page's fetches (the free tiers, then the paid one), not robots.txt's.
fn page_hops<'a>(steps: &[&'a Value]) -> Vec<&'a Value> {
    let robots: Vec<&Value> = steps
        .iter()
        .copied()
        .filter(|s| s["name"] == "robots")
        .collect();
    let page_fetches: Vec<&Value> = (steps.iter().copied())
        .filter(|s| s["name"] == "fetch")
        .filter(|s| !robots.iter().any(|r| r["span_id"] == s["parent_span_id"]))
        .collect();
    let mut hops: Vec<&Value> = (steps.iter().copied())
        .filter(|s| s["name"] == "hop")
        .filter(|s| {
            page_fetches
                .iter()
                .any(|f| f["span_id"] == s["parent_span_id"])
        })
        .collect();
    hops.sort_by_key(|s| s["start_unix_nano"].as_u64());
    hops
}

/// A block on tier 1, marked as the error it is, then the page on tier 2.
fn assert_climbed(hops: &[&Value]) {
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
}

#[tokio::test]
async fn a_task_that_waits_twice_and_climbs_a_tier_is_one_trace_from_its_producer() {
    // Arrange: sampled by the producer, so the worker's own share (none here) is not asked.
    let climb = Climb::arrange().await;
    let receiver = Receiver::start(Mode::Ok).await;
    let (traces, _guard) = traced_to(&receiver, 0.0);

    // Act
    climb.deliver_until_done().await;
    traces.flush();
    let (_, spans) = receiver.spans().await;

    // Assert: one trace, a span per delivery and per step.
    let records = records_of(&spans, "t1");
    let outcomes: Vec<&Value> = records
        .iter()
        .map(|r| &r["attributes"]["outcome"])
        .collect();
    assert_eq!(
        climb.stack.task("t1").await.status(),
        Some("successful"),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes,
        ["polite_requeued", "polite_requeued", "succeeded"]
    );
    assert_one_chain(&records, &climb.producer);
    for waited in &records[..2] {
        let steps = names(&under(&spans, waited));
        for step in ["parse", "guard", "host_turn", "copy"] {
            assert!(steps.contains_key(step), "{step} in {steps:?}");
        }
    }
    let fetched = &records[2]["attributes"];
    assert_eq!(
        (&fetched["reply"], &fetched["tier"]),
        (&"ack".into(), &2.into())
    );
    assert_eq!(fetched["host"], climb.site.addr.to_string().as_str());
    let steps = under(&spans, records[2]);
    let counted = names(&steps);
    let expected = [
        "parse",
        "guard",
        "host_turn",
        "host_start",
        "fetch",
        "put_if_absent",
        "terminal_write",
    ];
    for step in expected {
        assert!(counted.contains_key(step), "{step} in {counted:?}");
    }
    assert_climbed(&page_hops(&steps));
    // Nothing from the page, the URL's query or the proxies' password in any span.
    let text = serde_json::to_string(&spans).expect("JSON");
    let body = conveyor_testkit::site::challenged_page(CASE);
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

/// Where spans go in a run of the real binary.
enum Collector {
    Off,
    Up(Receiver),
    Slow(Receiver),
    Down(String),
}

/// What a run of the real binary did: its replies with when each came, when it asked for
/// each event, and what it printed.
struct Ran {
    replies: Vec<(std::time::Instant, Value)>,
    asked: Vec<std::time::Instant>,
    printed: String,
}

const EXPORT_BOUND: Duration = Duration::from_millis(300);

/// Runs `conveyor-worker` behind a stand-in Runtime API for two events: a page and a
/// site that is down, then a page.
async fn run_the_function(stack: &Stack, site: &Site, collector: &Collector) -> Ran {
    let api = RuntimeApi::start(two_events(stack, site).await).await;
    let endpoint = match collector {
        Collector::Off => None,
        Collector::Up(r) | Collector::Slow(r) => Some(r.endpoint.clone()),
        Collector::Down(endpoint) => Some(endpoint.clone()),
    };
    let child = function(stack, &api, endpoint)
        .stdout(std::process::Stdio::piped())
        .spawn();
    let mut child = child.expect("start the worker");
    let asked_thrice = api.wait_for_asks(3, Duration::from_secs(60)).await;
    let _ = child.start_kill();
    let out = child.wait_with_output().await.expect("it ran");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        asked_thrice,
        "the worker asked for a third event: {printed}"
    );
    let replies = (api.responses().into_iter())
        .map(|(at, text)| {
            (
                at,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        })
        .collect();
    Ran {
        replies,
        asked: api.asked(),
        printed,
    }
}

/// Two events: a page and a site that is down, then a page (tasks of their own each time).
async fn two_events(stack: &Stack, site: &Site) -> Vec<String> {
    let [ok, down, later] = ["ok", "down", "later"].map(|t| format!("{t}-{}", fastrand::u32(..)));
    stack
        .put_task(&ok, &site.url("/article/2000"), "pending")
        .await;
    stack.put_task(&down, &site.url("/down/x"), "pending").await;
    stack
        .put_task(&later, &site.url("/article/1000"), "pending")
        .await;
    let first = event(vec![
        record("m-ok", &body(&ok), 1),
        record("m-down", &body(&down), 1),
    ]);
    let second = event(vec![record("m-later", &body(&later), 1)]);
    [first, second]
        .map(|e| serde_json::to_string(&e).expect("JSON"))
        .to_vec()
}

/// `conveyor-worker` as Lambda starts it, against `api`, tracing to `endpoint` if any.
fn function(stack: &Stack, api: &RuntimeApi, endpoint: Option<String>) -> tokio::process::Command {
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_conveyor-worker"));
    let tracing = if endpoint.is_some() { "on" } else { "off" };
    worker.envs(scenario::unlimited_env(stack)).envs([
        // Signed as the function's role, which the emulator checks each call against.
        ("AWS_ACCESS_KEY_ID", WORKER_KEY.into()),
        ("AWS_LAMBDA_RUNTIME_API", api.addr.to_string()),
        ("AWS_LAMBDA_FUNCTION_NAME", "conveyor-worker".into()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".into()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512".into()),
        ("TRACING", tracing.into()),
        ("TRACE_SAMPLE_RATE", "1".into()),
        (
            "TRACE_EXPORT_TIMEOUT_MS",
            EXPORT_BOUND.as_millis().to_string(),
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.unwrap_or_default()),
    ]);
    worker.kill_on_drop(true);
    worker
}

/// The EMF document of each invocation, in order.
fn metrics_of(printed: &str) -> Vec<Value> {
    (printed.lines())
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|doc| doc.get("_aws").is_some() && doc.get("Records").is_some())
        .collect()
}

#[tokio::test]
async fn a_collector_that_is_down_or_slow_changes_no_reply_and_holds_the_sandbox_at_most_its_bound()
{
    // Arrange: the same two invocations with tracing off, with a collector that answers,
    // one that hangs for 30 s, and none at all.
    let stack = Stack::new().await;
    let site = Site::start().await;
    stack.put_active_run().await;
    let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let down = format!("http://{}", gone.local_addr().expect("an address"));
    drop(gone);
    let collectors = [
        ("off", Collector::Off),
        ("up", Collector::Up(Receiver::start(Mode::Ok).await)),
        ("slow", Collector::Slow(Receiver::start(Mode::Slow).await)),
        ("down", Collector::Down(down)),
    ];

    for (name, collector) in &collectors {
        // Act
        let ran = run_the_function(&stack, &site, collector).await;

        // Assert
        assert_unhurried(name, &ran);
        assert_spans_accounted_for(name, collector, &ran).await;
    }
}

/// The same replies whatever the collector, each invocation's work unhurried by it, and
/// the next event asked for within the export's bound after each reply.
fn assert_unhurried(name: &str, ran: &Ran) {
    assert_eq!(ran.replies.len(), 2, "{name}: {}", ran.printed);
    let failed = &ran.replies[0].1["batchItemFailures"];
    assert_eq!(
        failed,
        &serde_json::json!([{ "itemIdentifier": "m-down" }]),
        "{name}"
    );
    assert_eq!(
        ran.replies[1].1["batchItemFailures"],
        serde_json::json!([]),
        "{name}"
    );
    for (n, (replied, _)) in ran.replies.iter().enumerate() {
        let worked = replied.duration_since(ran.asked[n]);
        assert!(
            worked < Duration::from_secs(10),
            "{name}: invocation {n} took {worked:?}"
        );
        let held = ran.asked[n + 1].duration_since(*replied);
        let most = EXPORT_BOUND + Duration::from_millis(1_500);
        assert!(
            held < most,
            "{name}: the next event asked for {held:?} after the reply"
        );
    }
}

/// Spans sent after each invocation when the collector answers; counted as dropped in the
/// next invocation's metrics when it does not.
async fn assert_spans_accounted_for(name: &str, collector: &Collector, ran: &Ran) {
    let metrics = metrics_of(&ran.printed);
    assert_eq!(metrics.len(), 2, "{name}: {}", ran.printed);
    let dropped = metrics[1]["TraceSpansDropped"].as_u64();
    match collector {
        Collector::Up(receiver) => {
            assert_eq!(dropped, Some(0), "{name}");
            let (_, spans) = receiver.spans().await;
            let records = spans.iter().filter(|s| s["name"] == "record").count();
            assert_eq!(records, 3, "{name}: flushed after each invocation");
        }
        Collector::Off => assert_eq!(dropped, Some(0), "{name}"),
        Collector::Slow(_) | Collector::Down(_) => {
            assert!(
                dropped > Some(0),
                "{name}: the first invocation's spans counted"
            );
        }
    }
}

/// The trace header of the copy a waiting delivery of `task` sends, with `header` from its
/// producer (if any), traced by `traced`.
async fn copy_header(
    stack: &Stack,
    site: &Site,
    header: Option<&str>,
    task: &str,
) -> Option<String> {
    stack
        .put_task(task, &site.url("/article/100"), "pending")
        .await;
    let queue = Queue::create(stack, 30).await;
    match header {
        Some(header) => send_traced(stack, &queue, task, header).await,
        None => drop(queue.send(stack, &body(task)).await),
    }
    let record = next(stack, &queue).await;
    stack.cool_host(&site.addr.to_string(), 2).await;
    let worker = stack.worker_with(|t| t.politeness = production_defaults());
    let reply = run_batch(&worker, vec![record]).await;
    assert!(retried(&reply).is_empty(), "a wait is a copy: {reply:?}");
    let copy = next(stack, &queue).await;
    copy.attributes.get(trace::HEADER).cloned()
}

#[tokio::test]
async fn the_producers_sampling_decision_holds_and_tracing_off_passes_its_header_on_unchanged() {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let (sampled, trace_id, _) = producer_header();
    let unsampled = sampled.replace("Sampled=1", "Sampled=0");

    // Tracing off (no exporter on this thread): the copy carries the producer's header.
    let site = Site::start().await;
    let off = copy_header(&stack, &site, Some(&sampled), "off").await;
    assert_eq!(off.as_deref(), Some(sampled.as_str()));

    // On, everything sampled, but the producer said no: its trace goes on, unrecorded.
    let receiver = Receiver::start(Mode::Ok).await;
    let (traces, _guard) = traced_to(&receiver, 1.0);
    let site = Site::start().await;
    let declined = copy_header(&stack, &site, Some(&unsampled), "declined").await;
    let declined = declined.expect("a header");
    let root = format!("Root=1-{}-{};", &trace_id[..8], &trace_id[8..]);
    assert!(
        declined.starts_with(&root) && declined.ends_with("Sampled=0"),
        "{declined}"
    );
    assert_ne!(declined, unsampled, "the copy's parent is this delivery");

    // On, with no header and a share of none: a trace of its own, unrecorded.
    drop((traces, _guard));
    let (traces, _guard) = traced_to(&receiver, 0.0);
    let site = Site::start().await;
    let fresh = copy_header(&stack, &site, None, "unsampled")
        .await
        .expect("a header");
    // The message's own trace: its id begins with the time SQS took the message.
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    let now = now.expect("after 1970").as_secs();
    let took = u64::from_str_radix(&fresh["Root=1-".len()..][..8], 16).expect("hex");
    assert!(
        now.abs_diff(took) < 120 && fresh.ends_with("Sampled=0"),
        "{fresh}"
    );
    traces.flush();
    let (_, spans) = receiver.spans().await;
    let records: Vec<&Value> = spans.iter().filter(|s| s["name"] == "record").collect();
    assert!(records.is_empty(), "no delivery recorded: {records:#?}");
}

#[tokio::test]
async fn a_final_attempt_the_cutoff_stopped_is_copied_within_its_own_trace() {
    // Arrange: a traced final receive whose page takes longer than the invocation has.
    let pages = conveyor_testkit::memory::MemoryPages {
        body: bytes::Bytes::from_static(b"page"),
        delay: Duration::from_secs(5),
    };
    let worker = conveyor_testkit::memory::worker(pages, 1, "http://example.com/a");
    let (header, trace_id, producer_span) = producer_header();
    let mut last = record("m1", &body("t0"), conveyor_testkit::MAX_ATTEMPTS);
    last.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:tasks".into());
    last.attributes.insert(trace::HEADER.into(), header);
    let receiver = Receiver::start(Mode::Ok).await;
    let (_traces, _guard) = traced_to(&receiver, 0.0);

    // Act
    let deadline = SystemTime::now() + Duration::from_secs(3);
    let limits = conveyor_worker::batch::BatchLimits {
        max_concurrency: 4,
        deadline_margin: Duration::from_millis(500),
    };
    let run = conveyor_worker::batch::run_batch(&worker, &[last], "r", deadline, limits).await;

    // Assert: sent again, its copy in the task's trace (the producer's), as the child of
    // this delivery, not of the invocation.
    assert!(
        run.response.batch_item_failures.is_empty(),
        "{:?}",
        run.response
    );
    let copies = worker.visibility.copies();
    let copied = copies[0].trace_header.as_deref().expect("a trace header");
    let root = format!("Root=1-{}-{};", &trace_id[..8], &trace_id[8..]);
    assert!(copied.starts_with(&root), "{copied}");
    assert!(
        !copied.contains(&producer_span) && copied.ends_with("Sampled=1"),
        "{copied}"
    );
}
