//! The renderer as its Lambda function runs it: the worker's pipeline (guard, claim,
//! converge, the ack contract) against the emulator, with politeness at its production
//! defaults and the browser as the fetcher. A client-rendered page is stored with the text
//! its script fetched, counted once under a duplicate delivery; a page the site fails is
//! retried, and fails with its status on its last attempt; a browser that cannot start is
//! our failure. The plain worker hands a task over (`render: always`, or `auto` and a
//! shell) and the renderer finishes it, once. Through proxy tiers (real tinyproxy), a
//! page's requests carry the tier's credentials, a block climbs a tier and a proxy that is
//! down is ours; a job's screenshot lands beside its page; and, through SQS with a
//! dead-letter queue, a hung or out-of-memory page fails after its tries while a browser
//! that cannot start is dead-lettered with its task open.

use std::collections::HashMap;
use std::time::Duration;

use conveyor_renderer::fetcher::{RENDERED_TYPE, RenderSettings};
use conveyor_testkit::app_site::rendered_text;
use conveyor_testkit::forward_proxy::ForwardProxy;
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::batch;
use conveyor_worker::domain::proxy::{ProxySecret, Tiers};
use conveyor_worker::ports::queue::QueueRef;
use conveyor_worker::store::dynamo::{attributes, keys};

use crate::proxies::{DATACENTER, RESIDENTIAL, credentials, spend};
use conveyor_testkit::renderer::{TestRenderer, render_settings};
use conveyor_testkit::scenario::production_politeness;

use crate::blocks::challenged_tasks;
use crate::politeness::{Fleet, drain_by, tasks_at};
use crate::renderer::sites::{ok, raw_site};

fn renderer(stack: &Stack, tune: impl FnOnce(&mut WorkerTuning)) -> TestRenderer {
    stack.renderer_with(|tuning| {
        tuning.politeness = production_politeness();
        tune(tuning);
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
    let deadline = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    let run = batch::run_batch(&worker, &records, "request-1", deadline, LIMITS).await;

    // Assert: stored, marked, counted once; the invocation's metrics count the renders.
    let reply = run.response;
    assert!(retried(&reply).is_empty(), "{reply:?}");
    let own = |name: &str| run.tally.own.iter().find(|m| m.0 == name).map(|m| m.2);
    assert!(own("Renders") >= Some(2), "{:?}", run.tally.own);
    assert_eq!(own("BrowserLaunches"), Some(1));
    assert!(
        own("BrowserProxyRequests") >= Some(4),
        "{:?}",
        run.tally.own
    );
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
    let wrong = demo::ended_otherwise(&stack, demo::RENDERED).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
    let page = stack.task_in(demo::JOB, demo::RENDER_RUN, "app-page").await;
    let key = page.s("result_key").expect("a result key").to_owned();
    let object = stack.object(&key).await.expect("the stored page");
    assert!(String::from_utf8_lossy(&object.body).contains(&rendered_text("demo")));
}

/// The job, active, with `render` set to `choice`.
async fn job_rendering(stack: &Stack, choice: &str) {
    let mut item = keys::job_key(&id(JOB));
    item.insert("status".into(), attributes::s("active"));
    item.insert("render".into(), attributes::s(choice));
    stack.put_item(item).await;
}

/// The plain worker, handing pages that need a browser over to `queue`.
fn handing_over(stack: &Stack, queue: &Queue) -> TestWorker {
    let render_queue = QueueRef::from_arn(&queue.arn);
    stack.worker_with(|t| {
        t.politeness = production_politeness();
        t.render_queue = render_queue;
    })
}

#[tokio::test]
async fn a_task_of_a_job_that_always_renders_goes_to_the_renderer_untouched_and_is_rendered_once() {
    // Arrange: a job that says `render: always`; the worker knows the renderer's queue.
    let stack = Stack::new().await;
    job_rendering(&stack, "always").await;
    stack.put_counted_run(JOB, RUN, 1).await;
    let site = Site::start().await;
    stack
        .put_task("app", &site.url("/app/always"), "pending")
        .await;
    let queue = Queue::create(&stack, 30).await;

    // Act: the worker's delivery, then the renderer's of what it handed over.
    let first = run_batch(&handing_over(&stack, &queue), vec![delivery("app")]).await;
    let pending = stack.task("app").await;
    let handed = queue
        .receive(&stack)
        .await
        .expect("a message on the render queue");
    let second = run_batch(&renderer(&stack, |_| {}), vec![handed.clone()]).await;

    // Assert: no request, no attempt, from the worker; one render, counted once.
    assert!(retried(&first).is_empty() && retried(&second).is_empty());
    assert_eq!(
        (pending.status(), pending.n("attempts")),
        (Some("pending"), None)
    );
    assert!(
        handed
            .body
            .as_deref()
            .unwrap_or_default()
            .contains(r#""render_reason":"always""#)
    );
    let task = stack.task("app").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    assert_eq!(task.s("render_reason"), Some("always"));
    assert_eq!(task.n("attempts"), Some(1));
    assert_eq!(site.hits("/app/always"), 1, "fetched by the browser alone");
    assert_eq!(stack.run_counters(JOB, RUN).await, (1, 0, 0));
}

#[tokio::test]
async fn with_auto_a_shell_goes_to_the_renderer_and_a_page_is_stored_plain() {
    // Arrange: a job that says `render: auto`: one app shell, one ordinary page.
    let stack = Stack::new().await;
    job_rendering(&stack, "auto").await;
    stack.put_counted_run(JOB, RUN, 2).await;
    let (shell_site, page_site) = (Site::start().await, Site::start().await);
    stack
        .put_task("shell", &shell_site.url("/app/auto"), "pending")
        .await;
    stack
        .put_task("page", &page_site.url("/article/4000"), "pending")
        .await;
    let queue = Queue::create(&stack, 30).await;

    // Act
    let records = vec![delivery("shell"), delivery("page")];
    let first = run_batch(&handing_over(&stack, &queue), records).await;
    let shell_then = stack.task("shell").await;
    let handed = queue
        .receive(&stack)
        .await
        .expect("the shell on the render queue");
    let second = run_batch(&renderer(&stack, |_| {}), vec![handed]).await;

    // Assert: the page stored plain; the shell fetched once plain, its attempt given back,
    // then rendered with its rule as the reason; both counted once.
    assert!(retried(&first).is_empty() && retried(&second).is_empty());
    assert_eq!(
        queue.receive(&stack).await.map(|m| m.body),
        None,
        "one message only"
    );
    let page = stack.task("page").await;
    assert_eq!(page.status(), Some("successful"));
    assert_eq!(page.0.get("rendered"), None);
    assert_eq!(shell_then.n("attempts").unwrap_or(0), 0, "{shell_then:?}");
    let shell = stack.task("shell").await;
    assert_eq!(shell.status(), Some("successful"), "{shell:?}");
    assert_eq!(shell.s("render_reason"), Some("mount node"));
    assert_eq!(shell.0.get("shell"), None, "the rendered page is no shell");
    let key = shell.s("result_key").expect("a key").to_owned();
    let object = stack.object(&key).await.expect("stored");
    assert!(String::from_utf8_lossy(&object.body).contains(&rendered_text("auto")));
    assert_eq!(
        shell_site.hits("/app/auto"),
        2,
        "once plain, once in the browser"
    );
    assert_eq!(stack.run_counters(JOB, RUN).await, (2, 0, 0));
}

#[tokio::test]
async fn a_browser_that_cannot_start_is_our_failure_retried_and_never_the_tasks() {
    // Arrange: a renderer whose browser is not there, on the task's final attempt.
    let stack = Stack::new().await;
    stack.put_job(JOB, "active").await;
    stack.put_counted_run(JOB, RUN, 1).await;
    let site = Site::start().await;
    stack
        .put_task("app", &site.url("/app/missing"), "pending")
        .await;
    let worker = stack.renderer_of(broken_browser(), |t| {
        t.politeness = WorkerTuning::default().politeness;
    });

    // Act
    let reply = run_batch(&worker, vec![record("app", &body("app"), 5)]).await;

    // Assert
    assert_eq!(retried(&reply), vec!["app".to_owned()]);
    assert_ne!(stack.task("app").await.status(), Some("failed"));
}

/// A renderer whose pages go through the proxy `tiers`, with the test proxies' credentials,
/// and politeness at its production defaults.
fn proxied_renderer(stack: &Stack, tiers: &[String]) -> TestRenderer {
    let tiers = Tiers::parse(&tiers.join(";")).expect("proxy URLs");
    let secret = ProxySecret::parse(&credentials()).expect("a proxy secret");
    renderer(stack, |t| {
        t.proxies = tiers;
        t.proxy_secret = secret;
    })
}

/// The stored page of task `id`, as text.
async fn stored_text(stack: &Stack, id: &str) -> String {
    let task = stack.task(id).await;
    assert_eq!(task.status(), Some("successful"), "{id}: {task:?}");
    let key = task.s("result_key").expect("a result key").to_owned();
    let object = stack.object(&key).await.expect("the stored object");
    assert!(
        object.metadata.contains_key("rendered"),
        "{id}: not marked rendered"
    );
    String::from_utf8_lossy(&object.body).into_owned()
}

#[tokio::test]
async fn a_rendered_pages_requests_go_through_its_hosts_proxy_with_credentials_and_a_block_climbs_a_tier()
 {
    // Arrange: two tiers of tinyproxy asking for credentials. One site blocks the first
    // tier's egress; the other serves an app page whose text arrives by XHR.
    let stack = Stack::new().await;
    let datacenter = ForwardProxy::start(DATACENTER.into(), true).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), true).await;
    let (blocking, app) = (Site::start().await, Site::start().await);
    stack.put_active_run().await;
    let blocked = format!("/blocks/{}/x", datacenter.egress);
    stack
        .put_task("blocked", &blocking.url(&blocked), "pending")
        .await;
    stack
        .put_task("app", &app.url("/app/shop"), "pending")
        .await;
    let worker = proxied_renderer(&stack, &[datacenter.url(), residential.url()]);

    // Act
    let reply = run_batch(&worker, vec![delivery("blocked"), delivery("app")]).await;

    // Assert: the blocked page climbed to the residential tier; the app page and its XHR
    // went through the first tier, never direct; the run's spend counts each tier.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    let through = stored_text(&stack, "blocked").await;
    assert!(
        through.contains(&format!("through {}", residential.egress)),
        "{through}"
    );
    assert!(
        stored_text(&stack, "app")
            .await
            .contains(&rendered_text("shop"))
    );
    let climbed = blocking.peers_of(&blocked);
    assert_eq!(climbed, [datacenter.egress, residential.egress]);
    assert_eq!(app.peers_of("/app/shop"), [datacenter.egress]);
    assert_eq!(app.peers_of("/api/shop"), [datacenter.egress]);
    assert_eq!(spend(&stack, 1).await.0, Some(3), "2 documents and 1 XHR");
    assert_eq!(spend(&stack, 2).await.0, Some(1));
}

#[tokio::test]
async fn a_render_whose_proxy_is_down_gives_way_to_the_next_tier_and_the_last_ones_fault_is_ours() {
    // Arrange: the first tier's proxy is down (nothing listens on port 1); the second is up.
    let stack = Stack::new().await;
    let up = ForwardProxy::start(RESIDENTIAL.into(), true).await;
    let down = "http://127.0.0.1:1".to_owned();
    let site = Site::start().await;
    stack.put_active_run().await;
    stack
        .put_task("app", &site.url("/app/cart"), "pending")
        .await;
    stack
        .put_task("none", &site.url("/app/none"), "pending")
        .await;

    // Act: with both tiers; then, on its last attempt, with only the down one.
    let climbed = run_batch(
        &proxied_renderer(&stack, &[down.clone(), up.url()]),
        vec![delivery("app")],
    )
    .await;
    let last = record("none", &body("none"), MAX_ATTEMPTS);
    let stuck = run_batch(&proxied_renderer(&stack, &[down]), vec![last]).await;

    // Assert: rendered through the second tier; alone, the proxy's failure is ours even on
    // the last attempt: the record is retried, and the task is not failed.
    assert!(retried(&climbed).is_empty(), "{climbed:?}");
    assert!(
        stored_text(&stack, "app")
            .await
            .contains(&rendered_text("cart"))
    );
    assert!(site.peers().iter().all(|(_, ip)| *ip == up.egress));
    assert_eq!(
        retried(&stuck),
        ["none"],
        "the proxy's fault, on the last attempt too"
    );
    assert_eq!(stack.task("none").await.status(), Some("processing"));
}

/// The renderer's settings with a browser that cannot start.
fn broken_browser() -> RenderSettings {
    let mut broken = render_settings();
    broken.launch.executable = "/nonexistent/chromium".into();
    broken
}

/// A page of `script` alone, on a site of its own.
async fn scripted(script: &str) -> String {
    let page =
        format!("<!doctype html><html><body><p>start</p><script>{script}</script></body></html>");
    let site = raw_site(HashMap::from([("/".to_owned(), ok("text/html", &page))])).await;
    format!("http://{site}/")
}

/// One sandbox of two pollers, invocations of 10 s.
const ONE_SANDBOX: Fleet = Fleet {
    sandboxes: 1,
    pollers: 2,
    timeout: Duration::from_secs(10),
    limit: Duration::from_secs(120),
};

/// The renderer as deployed but quicker to retry: 3 s a render, hold-backs up to 0.5 s.
fn quick(t: &mut WorkerTuning) {
    t.politeness = production_politeness();
    t.scrape_timeout = Duration::from_secs(3);
    t.backoff.base = Duration::from_millis(100);
    t.backoff.max = Duration::from_millis(500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_sqs_a_page_that_hangs_or_runs_out_of_memory_fails_after_its_tries_and_a_browser_that_cannot_start_is_dead_lettered()
 {
    // Arrange: an app page, a page whose script never yields, and one that allocates
    // without end past a 64 MiB script heap, each on a host of its own; on another stack, a
    // renderer whose browser cannot start.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    let hang = scripted("while (true) {}").await;
    let oom = scripted("const kept = []; while (true) kept.push(new Array(1e6).fill(1));").await;
    let (queue, dlq) = tasks_at(&stack, &[site.url("/app/fine"), hang, oom]).await;
    let small_heap = {
        let mut settings = render_settings();
        settings.launch.heap_mib = 64;
        settings
    };
    let renderer = stack.renderer_of(small_heap, quick);
    let other = Stack::new().await;
    other.put_job(JOB, "active").await;
    let (lost, lost_dlq) = tasks_at(&other, &[site.url("/app/never")]).await;
    let broken = other.renderer_of(broken_browser(), quick);

    // Act
    drain_by(&stack, &queue, &[renderer], ONE_SANDBOX).await;
    drain_by(&other, &lost, &[broken], ONE_SANDBOX).await;

    // Assert: the page rendered; the hung and the out-of-memory pages failed once their tries
    // were spent, counted once, nothing dead-lettered; the launch failure is ours, its
    // task left open and its message in the dead-letter queue.
    assert!(
        stored_text(&stack, "t000")
            .await
            .contains(&rendered_text("fine"))
    );
    for (id, why) in [("t001", "did not load"), ("t002", "crashed")] {
        let task = stack.task(id).await;
        assert_eq!(task.status(), Some("failed"), "{id}: {task:?}");
        assert_eq!(task.n("attempts"), Some(u64::from(MAX_ATTEMPTS)), "{id}");
        assert!(
            task.s("error").is_some_and(|e| e.contains(why)),
            "{id}: {task:?}"
        );
    }
    assert_eq!(stack.run_counters(JOB, RUN).await, (1, 2, 0));
    assert!(dlq.drain(&stack).await.is_empty());
    assert_eq!(lost_dlq.drain(&other).await.len(), 1);
    let open = other.task("t000").await;
    assert_eq!(open.status(), Some("processing"), "{open:?}");
    assert_eq!(other.run_counters(JOB, RUN).await, (0, 0, 1));
}

#[tokio::test]
async fn a_job_asking_for_screenshots_gets_a_png_beside_its_rendered_page_once() {
    // Arrange: a job that renders always, with screenshots; its task delivered twice.
    let stack = Stack::new().await;
    let mut job = keys::job_key(&id(JOB));
    job.insert("status".into(), attributes::s("active"));
    job.insert("render".into(), attributes::s("always"));
    let yes = aws_sdk_dynamodb::types::AttributeValue::Bool(true);
    job.insert("render_screenshot".into(), yes);
    stack.put_item(job).await;
    stack.put_counted_run(JOB, RUN, 1).await;
    let site = Site::start().await;
    stack
        .put_task("shot", &site.url("/app/shot"), "pending")
        .await;

    // Act
    let records = vec![delivery("shot"), delivery("shot")];
    let reply = run_batch(&renderer(&stack, |_| {}), records).await;

    // Assert: the page, marked as having a PNG, and the PNG at its documented key.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    assert!(
        stored_text(&stack, "shot")
            .await
            .contains(&rendered_text("shot"))
    );
    let task = stack.task("shot").await;
    let key = task.s("result_key").expect("a result key");
    let page = stack.object(key).await.expect("the page");
    assert_eq!(
        page.metadata.get("screenshot").map(String::as_str),
        Some("png")
    );
    let png = stack.object(&format!("{key}~screenshot.png")).await;
    let png = png.expect("the PNG beside the page");
    assert_eq!(png.content_type, "image/png");
    assert!(png.body.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert_eq!(stack.run_counters(JOB, RUN).await, (1, 0, 0));
}

#[tokio::test]
async fn a_rendered_block_page_climbs_to_the_next_tier_slows_its_host_and_the_page_is_stored() {
    // Arrange: each site answers the datacenter pool with a block page, a 200 challenge
    // known by its body and Akamai's 403; the residential pool, the paid tier of a run with
    // a budget, gets the page. Politeness at its production defaults.
    let stack = Stack::new().await;
    let datacenter = ForwardProxy::start(DATACENTER.into(), true).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), true).await;
    stack.put_active_run().await;
    stack.set_paid_budget(10_000_000).await;
    let cases = ["cloudflare-interstitial-200", "akamai-access-denied"];
    let sites = challenged_tasks(&stack, datacenter.egress, &cases).await;
    let worker = proxied_renderer(&stack, &[datacenter.url(), residential.url()]);

    // Act
    let reply = run_batch(&worker, cases.map(delivery).to_vec()).await;

    // Assert: each rendered through both tiers, the page stored, a block on tier 1 each,
    // and its host slowed down all the same.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    for (case, (site, path)) in cases.iter().zip(&sites) {
        let stored = stored_text(&stack, case).await;
        assert!(
            stored.contains(&format!("<body>page {case}</body>")),
            "{case}: {stored}"
        );
        let asked = site.peers_of(path);
        assert_eq!(asked, [datacenter.egress, residential.egress], "{case}");
        let seen = stack.host_item(&site.addr.to_string(), "HOST").await;
        assert!(seen.n("slowdown").is_some(), "{case}: {seen:?}");
    }
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!((run.n("blocks_t1"), run.n("blocks_t2")), (Some(2), None));
    assert!(run.n("paid_tier_reserved_bytes").is_some(), "{run:?}");
}
