//! A real local HTTP site on 127.0.0.1 whose pages exercise every way a fetch can end.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes served by `/big`; tests set MAX_BODY_BYTES below it.
pub const BIG_BODY: usize = 64 * 1024;

#[derive(Clone, Default)]
struct Hits(Arc<Mutex<HashMap<String, usize>>>);

/// Who asked for what (path and peer, in order), and how many body bytes were served.
#[derive(Clone, Default)]
struct Served(Arc<Mutex<ServedLog>>);

type ServedLog = (Vec<(String, IpAddr)>, u64);

impl Hits {
    /// Counts this hit of `path` and returns how many there have been, this one included.
    fn count(&self, path: &str) -> usize {
        // A poisoned lock only means another request panicked; the counts are still right.
        let mut hits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = hits.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn get(&self, path: &str) -> usize {
        let hits = self.0.lock().unwrap_or_else(|p| p.into_inner());
        hits.get(path).copied().unwrap_or(0)
    }
}

/// A running site; it stops with the test's runtime.
#[derive(Clone)]
pub struct Site {
    pub addr: SocketAddr,
    hits: Hits,
    served: Served,
    aim: Aim,
}

/// Where the site's `/page/{name}` pages aim a browser besides their own text, if anywhere
/// ([`Site::aim_pages_at`]).
#[derive(Clone, Default)]
struct Aim(Arc<Mutex<Option<SocketAddr>>>);

impl Site {
    /// A site on 127.0.0.1.
    pub async fn start() -> Self {
        Self::start_on([127, 0, 0, 1].into()).await
    }

    /// A site on another loopback address (127.0.0.0/8 all routes to this machine), which a
    /// test can trust as "public" while 127.0.0.1 stays private.
    pub async fn start_on(ip: IpAddr) -> Self {
        let (hits, served, aim) = (Hits::default(), Served::default(), Aim::default());
        let app = Router::new()
            .route("/page/{name}", get(page))
            .route("/status/{code}", get(status))
            .route("/slow/{ms}", get(slow))
            .route("/big", get(big))
            .route("/bytes/{n}", get(bytes))
            .route("/redirect/{n}", get(redirect))
            .route("/varying/{name}", get(varying))
            .route("/retry-after/{secs}", get(retry_after_seconds))
            .route("/retry-after-date/{secs}", get(retry_after_date))
            .route("/redirect-to", get(redirect_to))
            .route("/encoded/{encoding}/{size}", get(encoded))
            .route("/article/{size}", get(article))
            .route("/flaky/{name}", get(flaky))
            .route("/down/{name}", get(down))
            .route("/gone/{name}", get(gone))
            .route("/slowpage/{name}", get(slow_page))
            .route("/long-type/{n}", get(long_type))
            .route("/long-redirect/{n}", get(long_redirect))
            .route("/trickle/{size}", get(trickle))
            .route("/blocks/{ip}/{name}", get(blocks))
            .route("/corpus/{name}", get(corpus))
            .route("/shells/{name}", get(shells))
            .route("/app/{name}", get(crate::app_site::app))
            .route("/api/{name}", get(crate::app_site::api))
            .route("/media/{file}", get(crate::app_site::media))
            .route("/challenged/{ip}/{answer}/{name}", get(challenged))
            .route("/forged-relay", get(forged_relay))
            .route("/down-saying-proxy/{name}", get(down_saying_proxy))
            .layer(axum::Extension(aim.clone()))
            .layer(middleware::from_fn_with_state(hits.clone(), count_hits))
            .layer(middleware::from_fn_with_state(served.clone(), serve_count))
            .with_state(hits.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("bind the local site on a loopback address");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            hits,
            served,
            aim,
        }
    }

    /// From now on, every `/page/{name}` page also aims a browser at `canary` every way a
    /// page can: an image, a script, a frame, a redirect in a frame, `fetch()` and a
    /// WebSocket. Its own text stays the same; a plain fetch sees only markup.
    pub fn aim_pages_at(&self, canary: SocketAddr) {
        *self.aim.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(canary);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The addresses that asked for `path`, in the order they asked: which proxy tier's
    /// egress reached the site.
    pub fn peers_of(&self, path: &str) -> Vec<IpAddr> {
        (self.peers().into_iter())
            .filter(|(p, _)| p == path)
            .map(|(_, ip)| ip)
            .collect()
    }

    /// How often `path` was requested.
    pub fn hits(&self, path: &str) -> usize {
        self.hits.get(path)
    }

    /// The addresses requests came from, in order, with their paths.
    pub fn peers(&self) -> Vec<(String, IpAddr)> {
        self.served
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// Body bytes served (of every response whose length was known).
    pub fn bytes_served(&self) -> u64 {
        self.served.0.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

async fn serve_count(State(served): State<Served>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let response = next.run(request).await;
    let bytes = http_body::Body::size_hint(response.body())
        .exact()
        .unwrap_or(0);
    let mut served = served.0.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(peer) = peer {
        served.0.push((path, peer));
    }
    served.1 += bytes;
    response
}

/// 403 to requests from `ip` (a proxy tier's egress a site has blocked), after `block_ms`
/// milliseconds if the query says so; the page to others: after `slow_ms` milliseconds and
/// padded to `bytes` bytes if the query says so, or, with `empty_gzip`, [`empty_gzip`].
async fn blocks(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((ip, name)): Path<(IpAddr, String)>,
    Query(query): Query<HashMap<String, u64>>,
) -> Response {
    if peer.ip() == ip {
        if let Some(ms) = query.get("block_ms") {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        return (StatusCode::FORBIDDEN, "blocked").into_response();
    }
    if let Some(ms) = query.get("slow_ms") {
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
    if query.contains_key("empty_gzip") {
        return empty_gzip();
    }
    let mut page = format!("page {name}, through {}", peer.ip());
    let padded = query.get("bytes").map_or(0, |&n| n as usize);
    page.extend(std::iter::repeat_n('.', padded.saturating_sub(page.len())));
    page.into_response()
}

/// An answer of the block pages' corpus (`block_pages`), as the file has it.
async fn corpus(Path(name): Path<String>) -> Response {
    served(&crate::block_pages::answer(&name))
}

/// An answer of the application shells' corpus, as the file has it.
async fn shells(Path(name): Path<String>) -> Response {
    use crate::block_pages::{SHELLS, answer_of};
    served(&answer_of(SHELLS, &name))
}

/// The corpus answer `answer` to requests from `ip` (a proxy tier's egress), the page
/// `name` to any other.
async fn challenged(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((ip, answer, name)): Path<(IpAddr, String, String)>,
) -> Response {
    if peer.ip() == ip {
        return served(&crate::block_pages::answer(&answer));
    }
    let page = challenged_page(&name);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

/// The page `/challenged/.../{name}` serves to requests it does not block.
pub fn challenged_page(name: &str) -> String {
    format!("<html><head><title>{name}</title></head><body>page {name}</body></html>")
}

fn served(answer: &crate::block_pages::Answer) -> Response {
    let mut response = Response::new(axum::body::Body::from(answer.body.clone()));
    *response.status_mut() = StatusCode::from_u16(answer.status).expect("a valid status");
    for (name, value) in &answer.headers {
        let name = header::HeaderName::from_bytes(name.as_bytes()).expect("a header name");
        let value = header::HeaderValue::from_str(value).expect("a header value");
        response.headers_mut().append(name, value);
    }
    response
}

/// A gzip body without end that decodes to nothing: its header, then empty deflate blocks
/// (stored, no bytes), 4 KB of them every 10 ms.
fn empty_gzip() -> Response {
    const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    const EMPTY_BLOCK: [u8; 5] = [0, 0, 0, 0xff, 0xff];
    let blocks = bytes::Bytes::from(EMPTY_BLOCK.repeat(800));
    let header = futures_util::stream::once(async { Ok(bytes::Bytes::from_static(&HEADER)) });
    let endless = futures_util::stream::repeat(blocks).then(|chunk| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, std::io::Error>(chunk)
    });
    (
        [(header::CONTENT_ENCODING, "gzip")],
        axum::body::Body::from_stream(header.chain(endless)),
    )
        .into_response()
}

async fn count_hits(State(hits): State<Hits>, request: Request, next: Next) -> Response {
    hits.count(request.uri().path());
    next.run(request).await
}

async fn page(Path(name): Path<String>, axum::Extension(aim): axum::Extension<Aim>) -> Response {
    let canary = *aim.0.lock().unwrap_or_else(|p| p.into_inner());
    let aimed = canary.map_or_else(String::new, |at| {
        format!(
            r#"<img src="http://{at}/i.png"><script src="http://{at}/s.js"></script>
<iframe src="http://{at}/f"></iframe><iframe src="/redirect-to?url=http://{at}/r"></iframe>
<script>fetch("http://{at}/x").catch(() => {{}}); new WebSocket("ws://{at}/w");</script>"#
        )
    });
    let body = format!("<html><body>page {name}{aimed}</body></html>");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

async fn status(Path(code): Path<u16>) -> impl IntoResponse {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    (code, format!("status {code}"))
}

async fn slow(Path(ms): Path<u64>) -> impl IntoResponse {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "slow page"
}

async fn bytes(Path(n): Path<usize>) -> impl IntoResponse {
    vec![b'x'; n]
}

async fn big() -> impl IntoResponse {
    vec![b'x'; BIG_BODY]
}

async fn redirect(Path(n): Path<u32>) -> Response {
    if n == 0 {
        "end of the redirects".into_response()
    } else {
        Redirect::to(&format!("/redirect/{}", n - 1)).into_response()
    }
}

/// Different bytes on every hit, after a pause that lets concurrent fetches overlap.
async fn varying(State(hits): State<Hits>, Path(name): Path<String>) -> impl IntoResponse {
    let n = hits.get(&format!("/varying/{name}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    (
        [(header::CONTENT_TYPE, "text/plain")],
        format!("{name}: version {n}"),
    )
}

/// 429 with `Retry-After: <secs>`.
async fn retry_after_seconds(Path(secs): Path<u64>) -> impl IntoResponse {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, secs.to_string())],
        "slow down",
    )
}

/// 503 with `Retry-After` as an HTTP date `<secs>` from now.
async fn retry_after_date(Path(secs): Path<u64>) -> impl IntoResponse {
    let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(secs));
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, at)],
        "down",
    )
}

/// A redirect to wherever `?url=` says: the way a public page sends a fetcher inwards.
async fn redirect_to(Query(query): Query<HashMap<String, String>>) -> Response {
    match query.get("url") {
        Some(url) => Redirect::to(url).into_response(),
        None => StatusCode::BAD_REQUEST.into_response(),
    }
}

/// An HTML page of about `size` bytes of prose (words of a small vocabulary and numbers,
/// as a real article compresses: to a fifth or so), gzip-encoded.
async fn article(Path(size): Path<usize>) -> Response {
    const WORDS: [&str; 24] = [
        "the", "run", "of", "pages", "a", "site", "serves", "through", "proxies", "and", "tasks",
        "with", "price", "in", "stock", "review", "shipping", "order", "color", "size", "delivery",
        "returns", "customer", "rating",
    ];
    let mut rng = fastrand::Rng::with_seed(size as u64);
    let mut page = String::from("<html><body><article>");
    while page.len() < size {
        page.push_str("<p>");
        for _ in 0..rng.usize(8..20) {
            page.push_str(WORDS[rng.usize(..WORDS.len())]);
            page.push(' ');
        }
        page.push_str(&format!(
            "{}.{:02}</p>\n",
            rng.u32(1..10_000),
            rng.u8(..100)
        ));
    }
    page.push_str("</article></body></html>");
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    match e.write_all(page.as_bytes()).and_then(|()| e.finish()) {
        Ok(body) => (
            [
                (header::CONTENT_ENCODING, "gzip"),
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            ],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `size` bytes of `a`, encoded with `gzip`, `deflate` or `br`.
async fn encoded(Path((encoding, size)): Path<(String, usize)>) -> Response {
    let plain = vec![b'a'; size];
    let body = match encoding.as_str() {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(&plain).and_then(|()| e.finish())
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(&plain).and_then(|()| e.finish())
        }
        "br" => {
            let mut out = Vec::new();
            let mut e = brotli::CompressorWriter::new(&mut out, 4096, 9, 22);
            let written = e.write_all(&plain).and_then(|()| e.flush());
            drop(e);
            written.map(|()| out)
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    match body {
        Ok(body) => (
            [
                (header::CONTENT_ENCODING, encoding),
                (header::CONTENT_TYPE, "text/plain".to_owned()),
            ],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// A 502 carrying the header the worker's relay answers with when it cannot reach its
/// proxy: a site may send any header.
async fn forged_relay() -> impl IntoResponse {
    (
        StatusCode::BAD_GATEWAY,
        [("x-conveyor-relay", "unreachable")],
        "the site's own 502",
    )
}

/// A 503 with a `Proxy-Status` error of the site's own (as a CDN in front of it may send):
/// the site is down, whatever the header says.
async fn down_saying_proxy(Path(name): Path<String>) -> impl IntoResponse {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [("proxy-status", "x; error=destination_unavailable")],
        format!("{name} is down"),
    )
}

/// A server that answers every connection with `reply` and then hangs up: a connection
/// reset (empty reply) or a body cut short.
pub async fn broken_server(reply: &'static [u8]) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a broken server on 127.0.0.1");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0_u8; 4096];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(reply).await;
            // Dropping the socket closes it mid-exchange.
        }
    });
    addr
}

/// A server that hangs up unanswered on its first request (as a peer closes an idle
/// connection a pool is reusing), then answers `ok` to every other; it says how many
/// requests it was sent.
pub async fn hangs_up_once() -> (SocketAddr, Arc<AtomicUsize>) {
    hangs_up(1, Duration::ZERO).await
}

/// A server that holds each of its first `times` requests for `after`, then hangs up
/// unanswered (a peer that chose not to answer), and answers `ok` to every later one; it
/// says how many requests it was sent.
pub async fn hangs_up(times: usize, after: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    raw_server(move |mut socket, count| async move {
        let mut request = [0_u8; 4096];
        let _ = socket.read(&mut request).await;
        if count.fetch_add(1, Ordering::Relaxed) >= times {
            let _ = socket.write_all(OK).await;
            return;
        }
        tokio::time::sleep(after).await;
        // Dropping the socket hangs up unanswered.
    })
    .await
}

/// A server that answers the first request of each connection and keeps it open, then
/// hangs up unanswered on the next request sent on it (as a peer closes a kept-alive
/// connection just as a pool reuses it); it says how many requests it was sent.
pub async fn hangs_up_on_reuse() -> (SocketAddr, Arc<AtomicUsize>) {
    raw_server(|mut socket, count| async move {
        let mut request = [0_u8; 4096];
        if socket.read(&mut request).await.unwrap_or(0) == 0 {
            return;
        }
        count.fetch_add(1, Ordering::Relaxed);
        if socket.write_all(OK).await.is_err() {
            return;
        }
        if socket.read(&mut request).await.unwrap_or(0) > 0 {
            count.fetch_add(1, Ordering::Relaxed);
        }
        // Dropping the socket hangs up unanswered.
    })
    .await
}

/// A minimal answer, kept alive.
const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// A server on 127.0.0.1 that hands each connection to `serve` with the count of requests
/// it was sent, which it says.
async fn raw_server<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream, Arc<AtomicUsize>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a server on 127.0.0.1");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, count.clone()));
        }
    });
    (addr, served)
}

/// 503 on the first two hits, then the page.
async fn flaky(State(hits): State<Hits>, Path(name): Path<String>) -> Response {
    if hits.get(&format!("/flaky/{name}")) <= 2 {
        (StatusCode::SERVICE_UNAVAILABLE, "not yet").into_response()
    } else {
        format!("flaky {name}, at last").into_response()
    }
}

/// Always 503.
async fn down(Path(name): Path<String>) -> impl IntoResponse {
    (StatusCode::SERVICE_UNAVAILABLE, format!("{name} is down"))
}

/// Always 404.
async fn gone(Path(name): Path<String>) -> impl IntoResponse {
    (StatusCode::NOT_FOUND, format!("{name} is gone"))
}

/// The page after 300 ms.
async fn slow_page(Path(name): Path<String>) -> impl IntoResponse {
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!("slow {name}")
}

/// A page whose `Content-Type` is `n` characters long.
async fn long_type(Path(n): Path<usize>) -> Response {
    let padding = "a".repeat(n.saturating_sub("text/html; x=".len()));
    let content_type = format!("text/html; x={padding}");
    (
        [(header::CONTENT_TYPE, content_type)],
        "a page with a long type",
    )
        .into_response()
}

/// A redirect to a page whose URL is `n` characters longer than usual.
async fn long_redirect(Path(n): Path<usize>) -> Response {
    Redirect::to(&format!("/page/long?pad={}", "a".repeat(n))).into_response()
}

/// `size` bytes of text, gzip-encoded, sent in 64 KiB chunks 5 ms apart with no
/// `Content-Length`: a page near the cap whose decoded body grows while every record of a
/// batch reads at once.
async fn trickle(Path(size): Path<usize>) -> Response {
    static GZIPPED: std::sync::OnceLock<Mutex<HashMap<usize, bytes::Bytes>>> =
        std::sync::OnceLock::new();
    let cache = GZIPPED.get_or_init(Default::default);
    let cached = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&size)
        .cloned();
    let body = match cached {
        Some(body) => body,
        None => {
            let mut rng = fastrand::Rng::with_seed(7);
            let text: Vec<u8> = (0..size).map(|_| rng.alphabetic() as u8).collect();
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let body = bytes::Bytes::from(
                e.write_all(&text)
                    .and_then(|()| e.finish())
                    .unwrap_or_default(),
            );
            let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.insert(size, body.clone());
            body
        }
    };
    let chunks = (0..body.len())
        .step_by(64 * 1024)
        .map(move |at| body.slice(at..(at + 64 * 1024).min(body.len())));
    let stream = futures_util::stream::iter(chunks).then(|chunk| async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok::<_, std::io::Error>(chunk)
    });
    (
        [(header::CONTENT_ENCODING, "gzip")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}
