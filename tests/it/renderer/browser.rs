//! A real Chromium (Debian's `chromium-headless-shell`, or `CHROMIUM_PATH`) rendering local
//! sites through the browser proxy: a client-rendered page is taken once its script has written it,
//! images are not loaded, every way a page can aim the browser inside reaches no canary, and
//! a browser that dies is replaced and leaves no process behind.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use conveyor_renderer::browser_proxy::{Bounds, BrowserProxy, Rules};
use conveyor_renderer::chromium::Chromium;
use conveyor_renderer::fetcher::{BrowserFetcher, RENDERED_TYPE, RenderSettings};
use conveyor_renderer::procs;
use conveyor_testkit::app_site::rendered_text;
use conveyor_testkit::direct_fetch_settings;
use conveyor_testkit::renderer::{launch, render_settings};
use conveyor_testkit::site::Site;
use conveyor_worker::domain::model::Page;
use conveyor_worker::domain::render::{Render, RenderOptions, Selector};
use conveyor_worker::scraper::policy::{AddressPolicy, Lookup};
use conveyor_worker::scraper::{Ask, FetchError, Fetcher, HttpFetcher};

use crate::renderer::sites::{Table, canary, found, ok, raw_site, udp_canary};

/// The sites' own address is trusted, as tests trust it for the plain fetch.
fn policy() -> AddressPolicy {
    AddressPolicy::new(false, None).trusting(["127.0.0.1".parse().unwrap()])
}

fn fetcher(lookup: Arc<dyn Lookup>, settings: RenderSettings) -> BrowserFetcher {
    let plain = direct_fetch_settings();
    let plain = HttpFetcher::with_policy(&plain, policy(), Arc::clone(&lookup)).expect("a client");
    BrowserFetcher::new(plain, (policy(), lookup), settings)
}

async fn rendered(fetcher: &BrowserFetcher, url: &str) -> Result<Page, FetchError> {
    fetcher
        .fetch(url, Ask::within(Duration::from_secs(20)))
        .await
        .page
}

#[tokio::test]
async fn a_client_rendered_page_is_taken_with_the_text_its_script_fetched_and_no_images() {
    let site = Site::start().await;
    let fetcher = fetcher(Arc::new(Table::of(&[])), render_settings());

    let page = rendered(&fetcher, &site.url("/app/shop?delay=200"))
        .await
        .expect("a page");

    let html = String::from_utf8_lossy(&page.body);
    assert!(html.contains(&rendered_text("shop")), "{html}");
    assert_eq!(page.http_status, 200);
    assert_eq!(page.content_type.as_str(), RENDERED_TYPE);
    assert_eq!(site.hits("/api/shop"), 1);
    assert_eq!(site.hits("/media/shop.png"), 0, "images are not loaded");
}

#[tokio::test]
async fn a_page_the_site_refuses_is_its_status_and_robots_txt_is_fetched_plain() {
    let site = Site::start().await;
    let fetcher = fetcher(Arc::new(Table::of(&[])), render_settings());

    let missing = rendered(&fetcher, &site.url("/status/404")).await;
    let robots = Ask {
        keep_first: Some(1024),
        ..Ask::within(Duration::from_secs(5))
    };
    let plain = fetcher.fetch(&site.url("/page/robots"), robots).await.page;

    assert_eq!(missing.expect_err("no page").http_status, Some(404));
    let plain = plain.expect("a plain page");
    assert_eq!(
        plain.body.as_ref(),
        b"<html><body>page robots</body></html>"
    );
    assert_eq!(
        fetcher.tally.renders.load(Ordering::Relaxed),
        1,
        "the 404 alone"
    );
}

/// What a job that waits for `selector` asks of one render.
fn waiting_for(selector: &str) -> RenderOptions {
    RenderOptions {
        render: Render::Always,
        wait_for: Some(Selector::parse(selector).expect("a selector")),
        timeout: Some(Duration::from_secs(3)),
        screenshot: false,
    }
}

#[tokio::test]
async fn a_page_is_taken_once_its_selector_shows_and_one_never_showing_it_fails_for_it() {
    // Arrange: an app page whose text comes after 200 ms, and one whose text comes long
    // after the render's 3 s.
    let site = Site::start().await;
    let fetcher = fetcher(Arc::new(Table::of(&[])), render_settings());
    let (loaded, invalid) = (waiting_for("p.loaded"), waiting_for("p["));
    let ask = |options| Ask {
        render: Some(options),
        ..Ask::within(Duration::from_secs(20))
    };

    // Act
    let shown = fetcher
        .fetch(&site.url("/app/soon?delay=200"), ask(&loaded))
        .await;
    let never = fetcher
        .fetch(&site.url("/app/late?delay=60000"), ask(&loaded))
        .await;
    let unparsed = fetcher
        .fetch(&site.url("/app/bad?delay=0"), ask(&invalid))
        .await;

    // Assert: the first has its text; the others fail for the selector, to be tried again.
    let page = shown.page.expect("the page");
    assert!(String::from_utf8_lossy(&page.body).contains(&rendered_text("soon")));
    for (fetched, selector) in [(never, "p.loaded"), (unparsed, "p[")] {
        let error = fetched.page.expect_err("no page");
        assert!(error.reason.contains(selector), "{error:?}");
        assert!(error.timed_out, "{error:?}");
    }
}

/// The page of every vector, each aimed at every target.
fn vectors_page(targets: &[String], ws: &[String], stun: SocketAddr) -> String {
    let mut html = String::from("<!doctype html><html><head><title>vectors</title>");
    for t in targets {
        html += &format!(
            r#"<link rel="stylesheet" href="{t}/c.css"><link rel="preconnect" href="{t}">
<link rel="dns-prefetch" href="{t}"><link rel="prefetch" href="{t}/p">
<script src="{t}/s.js"></script>"#
        );
    }
    html += "</head><body>";
    // Redirects from the allowed site to each target.
    for n in 0..targets.len() {
        html += &format!(r#"<iframe src="/to/{n}"></iframe><script src="/to/{n}"></script>"#);
    }
    for t in targets {
        html += &format!(
            r#"<img src="{t}/i"><iframe src="{t}/f"></iframe><object data="{t}/o"></object>
<video src="{t}/v"></video><form action="{t}/form" method="post"></form>"#
        );
    }
    let calls: Vec<String> = targets
        .iter()
        .map(|t| {
            format!(
                r#"fetch("{t}/x").catch(()=>{{}}); navigator.sendBeacon("{t}/b");
try {{ new EventSource("{t}/e"); }} catch (e) {{}}
try {{ const r = new XMLHttpRequest(); r.open("GET", "{t}/xhr"); r.send(); }} catch (e) {{}}"#
            )
        })
        .chain(
            ws.iter()
                .map(|w| format!(r#"try {{ new WebSocket("{w}"); }} catch (e) {{}}"#)),
        )
        .collect();
    html += &format!(
        r#"<p id="done">not yet</p><script>
{calls}
try {{
  const pc = new RTCPeerConnection({{iceServers: [{{urls: "stun:{stun}"}},
    {{urls: "turn:{stun}?transport=tcp", username: "u", credential: "c"}}]}});
  pc.createDataChannel("d");
  pc.createOffer().then(o => pc.setLocalDescription(o));
}} catch (e) {{}}
try {{ navigator.serviceWorker.register("/sw.js"); }} catch (e) {{}}
setTimeout(() => {{ document.getElementById("done").textContent = "still here"; }}, 300);
</script></body></html>"#,
        calls = calls.join("\n")
    );
    html
}

#[tokio::test]
async fn no_way_of_aiming_the_browser_inside_reaches_a_canary_and_the_page_is_still_taken() {
    let (loopback, loopback_hits) = canary("127.0.0.2").await;
    let (named, named_hits) = canary("127.0.0.3").await;
    let (stun, stun_hits) = udp_canary("127.0.0.2").await;
    let port = loopback.port();
    // Names the browser proxy resolves: inside, to the instance metadata address, to a private range.
    let table = Table::of(&[
        ("site.test", &["127.0.0.1"]),
        ("inside.test", &["127.0.0.3"]),
        ("metadata.test", &["169.254.169.254"]),
        ("private.test", &["10.1.2.3"]),
        ("mixed.test", &["127.0.0.1", "127.0.0.3"]),
    ]);
    let targets = vec![
        format!("http://127.0.0.2:{port}"),
        format!("http://[::ffff:127.0.0.2]:{port}"),
        format!("http://localhost:{port}"),
        format!("http://inside.test:{}", named.port()),
        format!("http://mixed.test:{}", named.port()),
        "http://metadata.test".to_owned(),
        "http://private.test".to_owned(),
        format!("https://127.0.0.2:{port}"),
    ];
    let ws = vec![
        format!("ws://127.0.0.2:{port}/ws"),
        format!("ws://inside.test:{}/ws", named.port()),
    ];
    let mut answers = HashMap::new();
    answers.insert(
        "/".to_owned(),
        ok("text/html", &vectors_page(&targets, &ws, stun)),
    );
    answers.insert("/sw.js".to_owned(), ok("text/javascript", ""));
    for (n, t) in targets.iter().enumerate() {
        answers.insert(format!("/to/{n}"), found(&format!("{t}/r")));
    }
    let site = raw_site(answers).await;
    let fetcher = fetcher(Arc::new(table), render_settings());

    let page = rendered(&fetcher, &format!("http://site.test:{}/", site.port())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let html = String::from_utf8_lossy(&page.expect("the page is taken").body).into_owned();
    assert!(html.contains("still here"), "{html}");
    assert_eq!(
        loopback_hits.load(Ordering::Relaxed),
        0,
        "127.0.0.2 reached"
    );
    assert_eq!(
        named_hits.load(Ordering::Relaxed),
        0,
        "a name inside reached"
    );
    assert_eq!(stun_hits.load(Ordering::Relaxed), 0, "WebRTC sent UDP");
    assert!(fetcher.tally.refused.load(Ordering::Relaxed) > 0);
}

/// A page whose script runs `script`, served at `/` of a raw site, and its URL.
async fn scripted(script: &str) -> String {
    let page =
        format!("<!doctype html><html><body><p>start</p><script>{script}</script></body></html>");
    let site = raw_site(HashMap::from([("/".to_owned(), ok("text/html", &page))])).await;
    format!("http://{site}/")
}

/// The processes of `group` once they are gone, or after two seconds.
async fn left_of(group: i32) -> Vec<procs::Member> {
    for _ in 0..40 {
        if procs::members(group).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    procs::members(group)
}

#[tokio::test]
async fn a_killed_browser_leaves_no_process_behind() {
    let refusing = Rules {
        policy: Arc::new(policy()),
        lookup: Arc::new(Table::of(&[])),
        bounds: Bounds {
            requests: 0,
            bytes: 0,
        },
        via: None,
    };
    let refuse_all = BrowserProxy::start(refusing)
        .await
        .expect("a browser proxy");
    let chromium = Chromium::launch(&launch(), refuse_all.addr())
        .await
        .expect("a browser");
    let group = chromium.group().expect("a process group");
    let running = procs::members(group);

    chromium.kill().await;

    assert!(
        running.len() >= 2,
        "the browser and its helpers: {running:?}"
    );
    assert_eq!(
        left_of(group).await,
        Vec::new(),
        "no process and no zombie is left"
    );
}

#[tokio::test]
async fn a_page_that_loops_forever_is_stopped_and_the_next_page_still_renders() {
    let looping = scripted("while (true) {}").await;
    let site = Site::start().await;
    let fetcher = fetcher(Arc::new(Table::of(&[])), render_settings());
    let short = Ask::within(Duration::from_secs(3));

    let stopped = fetcher.fetch(&looping, short).await.page;
    let next = rendered(&fetcher, &site.url("/app/after")).await;

    let stopped = stopped.expect_err("no page");
    assert_eq!(
        stopped.retry,
        conveyor_worker::scraper::Retry::Transient,
        "{stopped:?}"
    );
    let next = next.expect("the next page");
    assert!(String::from_utf8_lossy(&next.body).contains(&rendered_text("after")));
}

#[tokio::test]
async fn a_page_asking_for_ten_thousand_requests_is_cut_at_its_bound_and_taken() {
    let flood = scripted(
        "for (let i = 0; i < 10000; i++) fetch('/x' + i).catch(() => {}); \
         document.body.insertAdjacentHTML('beforeend', '<p>flooded</p>');",
    )
    .await;
    let bounds = Bounds {
        requests: 200,
        bytes: 16 << 20,
    };
    let fetcher = fetcher(
        Arc::new(Table::of(&[])),
        RenderSettings {
            bounds,
            ..render_settings()
        },
    );

    let page = rendered(&fetcher, &flood)
        .await
        .expect("the page as it stands");

    assert!(String::from_utf8_lossy(&page.body).contains("flooded"));
    let sent = fetcher.tally.requests.load(Ordering::Relaxed);
    assert!(
        sent <= 200,
        "{sent} requests went through the browser proxy"
    );
}

#[tokio::test]
async fn a_page_whose_dom_grows_without_end_fails_as_too_large() {
    let growing = scripted(
        "setInterval(() => document.body.insertAdjacentHTML('beforeend', \
         '<div></div>'.repeat(1000)), 5);",
    )
    .await;
    let small = RenderSettings {
        max_elements: 5_000,
        ..render_settings()
    };
    let fetcher = fetcher(Arc::new(Table::of(&[])), small);

    let failed = rendered(&fetcher, &growing).await.expect_err("no page");

    assert_eq!(
        failed.retry,
        conveyor_worker::scraper::Retry::Permanent,
        "{failed:?}"
    );
    assert!(failed.reason.contains("too large"), "{}", failed.reason);
}
