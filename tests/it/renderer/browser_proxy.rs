//! The browser proxy against every way a page could aim the browser at what the plain fetch
//! may not reach: literal private and loopback addresses, an IPv6-mapped one, the instance
//! metadata address, names that resolve inside (wholly or in part), and a redirect from an
//! allowed site. Canary listeners stand on loopback addresses the policy does not trust:
//! none of them is ever connected to, and the allowed site still answers through the browser proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use base64::Engine;
use conveyor_renderer::browser_proxy::{Bounds, BrowserProxy, Rules, Upstream};
use conveyor_testkit::forward_proxy::{self, ForwardProxy};
use conveyor_worker::scraper::policy::AddressPolicy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::renderer::sites::{Table, canary, read_head};

/// The most a render may ask for, when a test does not bound it.
const UNBOUNDED: Bounds = Bounds {
    requests: 1_000,
    bytes: 1 << 30,
};
/// The size of `/big`.
const BIG: usize = 64 * 1024;

/// The allowed site on 127.0.0.1: `/` is the page, `/big` 64 KiB; any other path redirects
/// to `to`.
async fn site(to: String) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a site");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let answer = answer(&String::from_utf8_lossy(&head), &to);
                let _ = stream.write_all(&answer).await;
            });
        }
    });
    addr
}

fn answer(request: &str, to: &str) -> Vec<u8> {
    let ok = |body: &[u8]| {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        [head.as_bytes(), body].concat()
    };
    if request.starts_with("GET / ") {
        return ok(b"the page");
    }
    if request.starts_with("GET /big ") {
        return ok(&vec![b'x'; BIG]);
    }
    format!(
        "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .into_bytes()
}

fn rules(names: &[(&str, &[&str])]) -> Rules {
    bounded(names, UNBOUNDED)
}

fn bounded(names: &[(&str, &[&str])], bounds: Bounds) -> Rules {
    Rules {
        policy: Arc::new(AddressPolicy::new(false, None).trusting(["127.0.0.1".parse().unwrap()])),
        lookup: Arc::new(Table::of(names)),
        bounds,
        via: None,
    }
}

/// The browser's client: every request through the browser proxy.
fn browser(proxy: &BrowserProxy) -> reqwest::Client {
    let proxy = reqwest::Proxy::all(format!("http://{}", proxy.addr())).expect("a proxy URL");
    reqwest::Client::builder()
        .proxy(proxy)
        .build()
        .expect("a client")
}

/// A `CONNECT` to `target` through the browser proxy: its status line, and what the tunnel answers
/// to a GET of `/` when it opened.
async fn connect(proxy: &BrowserProxy, target: &str) -> (String, String) {
    connect_for(proxy, target, "/").await
}

async fn connect_for(proxy: &BrowserProxy, target: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(proxy.addr())
        .await
        .expect("the browser proxy");
    let ask = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n");
    stream.write_all(ask.as_bytes()).await.unwrap();
    let mut head = vec![0; 1024];
    let read = stream.read(&mut head).await.unwrap_or(0);
    let status = String::from_utf8_lossy(&head[..read])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    if !status.contains(" 200") {
        return (status, String::new());
    }
    let get = format!("GET {path} HTTP/1.1\r\nhost: site.test\r\nconnection: close\r\n\r\n");
    stream.write_all(get.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    (status, String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test]
async fn an_allowed_site_answers_through_the_browser_proxy_forwarded_and_tunnelled() {
    let site = site("http://127.0.0.1:9/".into()).await;
    let proxy = BrowserProxy::start(rules(&[("site.test", &["127.0.0.1"])]))
        .await
        .unwrap();

    let page = browser(&proxy)
        .get(format!("http://site.test:{}/", site.port()))
        .send()
        .await
        .expect("an answer");
    let status = page.status();
    let body = page.text().await.unwrap();
    let (opened, tunnelled) = connect(&proxy, &format!("site.test:{}", site.port())).await;

    assert_eq!((status.as_u16(), body.as_str()), (200, "the page"));
    assert!(opened.contains(" 200"), "{opened}");
    assert!(tunnelled.ends_with("the page"), "{tunnelled}");
    let counts = proxy.counts();
    assert_eq!(counts.allowed.load(Ordering::Relaxed), 2);
    assert_eq!(counts.refused.load(Ordering::Relaxed), 0);
    assert!(counts.bytes.load(Ordering::Relaxed) >= 8 + 8);
}

#[tokio::test]
async fn no_way_of_aiming_the_browser_inside_reaches_a_canary() {
    // Arrange: canaries on two untrusted loopback addresses; the allowed site redirects to
    // the first.
    let (inside, inside_hits) = canary("127.0.0.2").await;
    let (other, other_hits) = canary("127.0.0.3").await;
    let site = site(format!("http://{inside}/")).await;
    let proxy = BrowserProxy::start(rules(&[
        ("site.test", &["127.0.0.1"]),
        ("inside.test", &["127.0.0.2"]),
        ("rebind.test", &["127.0.0.1", "127.0.0.3"]),
        ("metadata.test", &["169.254.169.254"]),
    ]))
    .await
    .unwrap();
    let forwarded = [
        format!("http://{inside}/"),
        format!("http://inside.test:{}/", inside.port()),
        format!("http://rebind.test:{}/", other.port()),
        format!("http://[::ffff:127.0.0.2]:{}/", inside.port()),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://metadata.test/latest/api/token".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "http://[::1]/".to_owned(),
        // Allowed, but it redirects inside: the browser's next request is refused.
        format!("http://site.test:{}/away", site.port()),
    ];
    let tunnelled = [
        other.to_string(),
        format!("inside.test:{}", inside.port()),
        format!("rebind.test:{}", other.port()),
        format!("[::ffff:127.0.0.3]:{}", other.port()),
        "169.254.169.254:443".to_owned(),
        "192.168.0.1:443".to_owned(),
    ];

    // Act
    let client = browser(&proxy);
    let mut statuses = Vec::new();
    for url in &forwarded {
        let answer = client.get(url).send().await.expect("an answer");
        statuses.push((url.clone(), answer.status().as_u16()));
    }
    for target in &tunnelled {
        let (status, _) = connect(&proxy, target).await;
        statuses.push((
            target.clone(),
            if status.contains(" 403") { 403 } else { 0 },
        ));
    }

    // Assert: every one refused, no canary reached, the refusals counted.
    let not_refused: Vec<_> = statuses.iter().filter(|(_, s)| *s != 403).collect();
    assert!(not_refused.is_empty(), "{not_refused:?}");
    assert_eq!(inside_hits.load(Ordering::Relaxed), 0);
    assert_eq!(other_hits.load(Ordering::Relaxed), 0);
    let counts = proxy.counts();
    assert_eq!(
        counts.allowed.load(Ordering::Relaxed),
        1,
        "the redirecting site alone"
    );
    assert_eq!(
        counts.refused.load(Ordering::Relaxed) as usize,
        forwarded.len() + tunnelled.len()
    );
}

#[tokio::test]
async fn past_its_requests_a_render_is_refused_and_said_over() {
    let site = site("http://127.0.0.1:9/".into()).await;
    let bounds = Bounds {
        requests: 3,
        ..UNBOUNDED
    };
    let proxy = BrowserProxy::start(bounded(&[("site.test", &["127.0.0.1"])], bounds))
        .await
        .unwrap();

    let client = browser(&proxy);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let url = format!("http://site.test:{}/", site.port());
        statuses.push(
            client
                .get(url)
                .send()
                .await
                .expect("an answer")
                .status()
                .as_u16(),
        );
    }

    assert_eq!(statuses, [200, 200, 200, 403, 403]);
    let counts = proxy.counts();
    assert_eq!(counts.refused.load(Ordering::Relaxed), 2);
    assert_eq!(counts.over.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn past_its_bytes_a_body_and_a_tunnel_are_cut_and_the_next_request_refused() {
    let site = site("http://127.0.0.1:9/".into()).await;
    let names: &[(&str, &[&str])] = &[("site.test", &["127.0.0.1"])];
    let bounds = Bounds {
        bytes: 16 * 1024,
        ..UNBOUNDED
    };
    let forwarded = BrowserProxy::start(bounded(names, bounds)).await.unwrap();
    let tunnelled = BrowserProxy::start(bounded(names, bounds)).await.unwrap();

    let url = format!("http://site.test:{}/big", site.port());
    let body = browser(&forwarded)
        .get(&url)
        .send()
        .await
        .expect("its head")
        .bytes()
        .await;
    let next = browser(&forwarded)
        .get(&url)
        .send()
        .await
        .expect("an answer")
        .status();
    let target = format!("site.test:{}", site.port());
    let (_, through) = connect_for(&tunnelled, &target, "/big").await;

    assert!(
        body.is_err(),
        "the body was cut: {:?}",
        body.map(|b| b.len())
    );
    assert_eq!(next.as_u16(), 403);
    assert!(through.len() < BIG, "{} bytes came through", through.len());
    for proxy in [&forwarded, &tunnelled] {
        assert!(proxy.counts().over.load(Ordering::Relaxed) >= 1);
    }
}

#[tokio::test]
async fn through_its_proxy_a_render_reaches_the_site_and_never_the_proxy_itself() {
    // Arrange: a real proxy (tinyproxy) asking for credentials, its connections from
    // 127.0.0.3; the browser proxy sends everything through it.
    let site = site("http://127.0.0.1:9/".into()).await;
    let upstream = ForwardProxy::start([127, 0, 0, 3].into(), true).await;
    let pair = format!("{}:{}", forward_proxy::USER, forward_proxy::PASSWORD);
    let basic = base64::engine::general_purpose::STANDARD.encode(pair);
    let via = Upstream {
        proxy: upstream.addr,
        authorization: Some(format!("Basic {basic}").parse().expect("a header value")),
    };
    let rules = Rules {
        via: Some(via),
        ..rules(&[])
    };
    let proxy = BrowserProxy::start(rules).await.unwrap();

    // Act
    let page = browser(&proxy)
        .get(format!("http://{site}/"))
        .send()
        .await
        .expect("an answer");
    let (status, body) = (page.status().as_u16(), page.text().await.unwrap());
    let (opened, tunnelled) = connect(&proxy, &site.to_string()).await;
    let at_the_proxy = browser(&proxy)
        .get(format!("http://{}/", upstream.addr))
        .send()
        .await
        .expect("an answer");

    // Assert
    assert_eq!((status, body.as_str()), (200, "the page"));
    assert!(opened.contains(" 200"), "{opened}");
    assert!(tunnelled.ends_with("the page"), "{tunnelled}");
    assert_eq!(at_the_proxy.status().as_u16(), 403);
    let logged = upstream.requests();
    assert!(
        logged.iter().any(|r| r.starts_with("GET http://"))
            && logged.iter().any(|r| r.starts_with("CONNECT ")),
        "{logged:?}"
    );
}
