//! The fetcher end to end: what it refuses to reach (redirect hops and resolved names
//! included), how it decodes, and which failures it calls transient. The "public" site stands
//! on 127.0.0.2, trusted by exact address; everything else on 127.0.0.0/8 stays private.
//! Every target here is on loopback, so even a regression sends nothing off this machine;
//! the other private and special ranges are proven by the policy's unit tests, which open
//! no connection.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use conveyor_testkit::site::{BIG_BODY, broken_server};
use conveyor_testkit::*;
use conveyor_worker::scraper::Lookup;
use futures_util::future::BoxFuture;

pub(crate) const PUBLIC: [u8; 4] = [127, 0, 0, 2];

/// Names a test resolves without DNS traffic.
pub(crate) struct Names(HashMap<&'static str, Vec<IpAddr>>);

impl Lookup for Names {
    fn lookup(&self, host: String) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let found = self.0.get(host.as_str()).cloned();
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such test name"))
        })
    }
}

pub(crate) fn names() -> Arc<Names> {
    let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
    Arc::new(Names(HashMap::from([
        ("localhost", vec![ip("127.0.0.1"), ip("::1")]),
        ("public.test", vec![ip("127.0.0.2")]),
        ("internal.test", vec![ip("127.0.0.1")]),
        ("rebind.test", vec![ip("127.0.0.2"), ip("127.0.0.1")]),
        ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
    ])))
}

/// [`names`], and these resolving to 127.0.0.1 too (one shared host).
pub(crate) fn names_also(extra: &[&'static str]) -> Arc<Names> {
    let mut table = Arc::into_inner(names()).expect("a fresh table").0;
    let local: IpAddr = [127, 0, 0, 1].into();
    table.extend(extra.iter().map(|name| (*name, vec![local])));
    Arc::new(Names(table))
}

/// A worker that only reaches the public internet (and the trusted "public" site).
fn strict_worker(stack: &Stack) -> TestWorker {
    stack.worker_with(|t| {
        t.allow_private_networks = false;
        t.trusted = vec![PUBLIC.into()];
        t.lookup = Some(names());
    })
}

#[tokio::test]
async fn redirects_and_names_that_lead_inside_are_refused_and_nothing_inside_is_reached() {
    let stack = Stack::new().await;
    let public = Site::start_on(PUBLIC.into()).await;
    let inside = Site::start().await; // 127.0.0.1: must never be hit
    stack.put_active_run().await;
    let cases = inward(&public, &inside);
    for (task, url) in &cases {
        stack.put_task(task, url, "pending").await;
    }
    let records = cases.iter().map(|(task, _)| delivery(task)).collect();

    let reply = run_batch(&strict_worker(&stack), records).await;

    assert_refused(&stack, &reply, &cases).await;
    assert_eq!(inside.hits("/page/in"), 0, "nothing inside was reached");
}

/// Every way in from `public` to `inside` (127.0.0.1) we know of: redirect hops spelling
/// the address, names resolving to it, schemes and credentials.
pub(crate) fn inward(public: &Site, inside: &Site) -> Vec<(&'static str, String)> {
    let port = inside.addr.port();
    let hop = |target: &str| {
        let target = url::form_urlencoded::byte_serialize(target.as_bytes()).collect::<String>();
        public.url(&format!("/redirect-to?url={target}"))
    };
    vec![
        (
            "hop-literal",
            hop(&format!("http://127.0.0.1:{port}/page/in")),
        ),
        ("hop-short", hop(&format!("http://127.1:{port}/page/in"))),
        (
            "hop-decimal",
            hop(&format!("http://2130706433:{port}/page/in")),
        ),
        (
            "hop-localhost",
            hop(&format!("http://localhost:{port}/page/in")),
        ),
        ("hop-v6", hop(&format!("http://[::1]:{port}/page/in"))),
        (
            "hop-mapped",
            hop(&format!("http://[::ffff:127.0.0.1]:{port}/page/in")),
        ),
        (
            "hop-name",
            hop(&format!("http://internal.test:{port}/page/in")),
        ),
        ("hop-scheme", hop("file:///etc/passwd")),
        (
            "name-internal",
            format!("http://internal.test:{port}/page/in"),
        ),
        (
            "name-rebind",
            format!("http://rebind.test:{}/page/x", public.addr.port()),
        ),
        ("name-mapped", format!("http://mapped.test:{port}/page/in")),
        (
            "credentials",
            format!("http://user:pw@public.test:{}/page/x", public.addr.port()),
        ),
    ]
}

/// Every case was refused for good, as a refusal.
pub(crate) async fn assert_refused(
    stack: &Stack,
    reply: &aws_lambda_events::event::sqs::SqsBatchResponse,
    cases: &[(&str, String)],
) {
    let retried = retried(reply);
    let why: Vec<_> = futures_util::future::join_all(retried.iter().map(|t| stack.task(t))).await;
    assert!(
        retried.is_empty(),
        "refusals are permanent: {retried:?} {why:?}"
    );
    for (task, _) in cases {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"), "{task}");
        let error = item.s("error").unwrap_or_default();
        let refused = [
            "not on the public internet",
            "not followed",
            "credentials",
            "not a page",
        ];
        assert!(refused.iter().any(|r| error.contains(r)), "{task}: {error}");
    }
}

#[tokio::test]
async fn a_public_name_and_a_public_redirect_are_followed() {
    let stack = Stack::new().await;
    let public = Site::start_on(PUBLIC.into()).await;
    stack.put_active_run().await;
    let port = public.addr.port();
    let hop = format!("http://public.test:{port}/page/landed");
    let target = url::form_urlencoded::byte_serialize(hop.as_bytes()).collect::<String>();
    stack
        .put_task(
            "named",
            &format!("http://public.test:{port}/page/named"),
            "pending",
        )
        .await;
    stack
        .put_task(
            "hopped",
            &public.url(&format!("/redirect-to?url={target}")),
            "pending",
        )
        .await;

    let reply = run_batch(
        &strict_worker(&stack),
        vec![delivery("named"), delivery("hopped")],
    )
    .await;

    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("named").await.status(), Some("successful"));
    let hopped = stack.task("hopped").await;
    assert_eq!(hopped.status(), Some("successful"));
    assert_eq!(hopped.s("final_url"), Some(hop.as_str()));
}

#[tokio::test]
async fn compressed_pages_are_stored_decoded_and_capped_after_decoding() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    for encoding in ["gzip", "deflate", "br"] {
        stack
            .put_task(
                encoding,
                &site.url(&format!("/encoded/{encoding}/5000")),
                "pending",
            )
            .await;
        let bomb = format!("{encoding}-bomb");
        let url = site.url(&format!("/encoded/{encoding}/{BIG_BODY}"));
        stack.put_task(&bomb, &url, "pending").await;
    }
    let records = [
        "gzip",
        "deflate",
        "br",
        "gzip-bomb",
        "deflate-bomb",
        "br-bomb",
    ]
    .into_iter()
    .map(delivery)
    .collect();

    let reply = run_batch(&stack.worker(), records).await;

    assert!(retried(&reply).is_empty());
    for encoding in ["gzip", "deflate", "br"] {
        let object = stack.object(&Stack::key(encoding)).await.expect("stored");
        assert_eq!(
            object.body,
            vec![b'a'; 5000],
            "{encoding}: the decoded bytes"
        );
        assert_eq!(object.content_type, "text/plain");
        let task = stack.task(encoding).await;
        assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
        let bomb = stack.task(&format!("{encoding}-bomb")).await;
        assert_eq!(
            bomb.status(),
            Some("failed"),
            "{encoding}: {BIG_BODY} bytes decoded"
        );
        assert!(
            bomb.s("error")
                .unwrap_or_default()
                .contains("MAX_BODY_BYTES")
        );
    }
}

#[tokio::test]
async fn resets_and_cut_bodies_are_transient() {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let reset = broken_server(b"").await;
    let cut = broken_server(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this").await;
    stack
        .put_task("reset", &format!("http://{reset}/"), "pending")
        .await;
    stack
        .put_task("cut", &format!("http://{cut}/"), "pending")
        .await;

    let reply = run_batch(&stack.worker(), vec![delivery("reset"), delivery("cut")]).await;

    assert_eq!(retried(&reply), ["reset", "cut"]);
    for task in ["reset", "cut"] {
        assert_eq!(
            stack.task(task).await.status(),
            Some("processing"),
            "{task}"
        );
    }
}

#[tokio::test]
async fn a_request_a_site_drops_on_a_reused_connection_is_sent_once_more_at_once() {
    // Arrange: a site that answers the first request of each connection, keeps it open,
    // and hangs up on the next one sent on it; two tasks, the second on the first's
    // connection.
    let (addr, served) = conveyor_testkit::site::hangs_up_on_reuse().await;
    let stack = Stack::new().await;
    stack.put_active_run().await;
    for task in ["t1", "t2"] {
        let url = format!("http://{addr}/{task}");
        stack.put_task(task, &url, "pending").await;
    }
    let worker = stack.worker();
    run_batch(&worker, vec![delivery("t1")]).await;

    // Act
    let reply = run_batch(&worker, vec![delivery("t2")]).await;

    // Assert
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t2").await.status(), Some("successful"));
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 3);
}

#[tokio::test]
async fn a_request_a_site_drops_on_a_fresh_connection_is_not_sent_again_at_once() {
    // Arrange
    let (addr, served) = conveyor_testkit::site::hangs_up_once().await;
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack
        .put_task("t1", &format!("http://{addr}/page"), "pending")
        .await;

    // Act
    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    // Assert: one request, back for a retry.
    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 1);
}
