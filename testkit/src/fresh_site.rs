//! A local site whose pages answer conditional requests as RFC 9110 says: each page has an
//! `ETag` and a `Last-Modified`, and a `GET` whose `If-None-Match` (weakly) or, without it,
//! `If-Modified-Since` still names it gets `304 Not Modified` with no body. A test changes a
//! page between runs. Pages under `/ignores/` send validators but always answer in full,
//! pages under `/dated/` send a `Last-Modified` alone, and pages under `/liar/` answer any
//! conditional request with a 304 that names another entity tag. A test can hold the next
//! conditional request of a page until it has done something between a worker's steps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

/// The bytes of a page unless the URL's `bytes` says otherwise.
const PAGE_BYTES: usize = 16 * 1024;

#[derive(Debug, Default)]
struct Pages {
    /// Each page's version: 0 until a test changes it.
    versions: HashMap<String, u32>,
    /// Answers given: full pages and 304s.
    full: usize,
    not_modified: usize,
    /// Requests of each page.
    hits: HashMap<String, usize>,
    /// When each request came, in order.
    starts: Vec<std::time::Instant>,
    /// The page whose next conditional request waits for the test ([`FreshSite::hold`]).
    hold: Option<(String, Hold)>,
}

/// The site's side of a held request: it says the request came, then waits.
#[derive(Debug)]
struct Hold {
    reached: oneshot::Sender<()>,
    resume: oneshot::Receiver<()>,
}

/// The test's side of a held request.
#[derive(Debug)]
pub struct Held {
    reached: oneshot::Receiver<()>,
    resume: oneshot::Sender<()>,
}

impl Held {
    /// Waits until the held request has come, then lets the site answer it once `between`
    /// is done.
    pub async fn between(self, between: impl AsyncFnOnce()) {
        self.reached.await.expect("the held request came");
        between().await;
        // The site may have stopped with its test: nothing is left to let go then.
        let _ = self.resume.send(());
    }
}

/// A running site; it stops with the test's runtime.
#[derive(Clone)]
pub struct FreshSite {
    pub addr: SocketAddr,
    pages: Arc<Mutex<Pages>>,
}

impl FreshSite {
    pub async fn start() -> Self {
        let pages = Arc::new(Mutex::new(Pages::default()));
        let app = Router::new()
            .route("/fresh/{name}", get(fresh))
            .route("/dated/{name}", get(dated))
            .route("/ignores/{name}", get(ignores))
            .route("/liar/{name}", get(liar))
            .with_state(pages.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("a bound address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, pages }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A new version of the page `name`: new bytes, a new `ETag` and `Last-Modified`.
    pub fn change(&self, name: &str) {
        *lock(&self.pages)
            .versions
            .entry(name.to_owned())
            .or_default() += 1;
    }

    /// Holds the next conditional request of the page `name` until the test lets it go.
    pub fn hold(&self, name: &str) -> Held {
        let (reached, reached_rx) = oneshot::channel();
        let (resume_tx, resume) = oneshot::channel();
        lock(&self.pages).hold = Some((name.to_owned(), Hold { reached, resume }));
        Held {
            reached: reached_rx,
            resume: resume_tx,
        }
    }

    /// The page `name` of `size` bytes as it is now, without asking the site: its bytes and
    /// entity tag.
    pub fn page(&self, name: &str, size: usize) -> (Vec<u8>, String) {
        let (body, etag, _) = current(&self.pages, name, size);
        (body.into_bytes(), etag)
    }

    /// How often the page `name` was asked for.
    pub fn hits(&self, name: &str) -> usize {
        lock(&self.pages).hits.get(name).copied().unwrap_or(0)
    }

    /// When each request so far came, in order.
    pub fn starts(&self) -> Vec<std::time::Instant> {
        lock(&self.pages).starts.clone()
    }

    /// (full answers, 304s) so far.
    pub fn answers(&self) -> (usize, usize) {
        let pages = lock(&self.pages);
        (pages.full, pages.not_modified)
    }
}

fn lock(pages: &Mutex<Pages>) -> MutexGuard<'_, Pages> {
    pages.lock().unwrap_or_else(|p| p.into_inner())
}

/// A page as it is now: its bytes, entity tag and `Last-Modified`.
fn current(pages: &Mutex<Pages>, name: &str, size: usize) -> (String, String, String) {
    let version = lock(pages).versions.get(name).copied().unwrap_or(0);
    let mut body = format!("<html><body>page {name}, version {version}</body></html>");
    body.extend(std::iter::repeat_n(' ', size.saturating_sub(body.len())));
    let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&body))[..16]);
    let modified =
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 3_600 * u64::from(version));
    (body, etag, httpdate::fmt_http_date(modified))
}

type Args = (
    State<Arc<Mutex<Pages>>>,
    Path<String>,
    Query<HashMap<String, usize>>,
    HeaderMap,
);

async fn fresh((State(pages), Path(name), Query(query), asked): Args) -> Response {
    if conditional(&asked) {
        let held = {
            let mut pages = lock(&pages);
            let ours = pages.hold.as_ref().is_some_and(|(page, _)| *page == name);
            ours.then(|| pages.hold.take()).flatten()
        };
        if let Some((_, hold)) = held {
            // A test that stopped waiting (it failed) lets the request go at once.
            let _ = hold.reached.send(());
            let _ = hold.resume.await;
        }
    }
    answer(&pages, &name, &query, &asked, (true, true))
}

fn conditional(asked: &HeaderMap) -> bool {
    asked.contains_key(header::IF_NONE_MATCH) || asked.contains_key(header::IF_MODIFIED_SINCE)
}

async fn dated((State(pages), Path(name), Query(query), asked): Args) -> Response {
    answer(&pages, &name, &query, &asked, (false, true))
}

async fn ignores((State(pages), Path(name), Query(query), asked): Args) -> Response {
    answer(&pages, &name, &query, &asked, (false, false))
}

async fn liar((State(pages), Path(name), Query(query), asked): Args) -> Response {
    if !conditional(&asked) {
        return answer(&pages, &name, &query, &asked, (true, true));
    }
    let mut counts = lock(&pages);
    counts.not_modified += 1;
    *counts.hits.entry(name).or_default() += 1;
    drop(counts);
    let mut response = StatusCode::NOT_MODIFIED.into_response();
    let other = "\"another-representation\""
        .parse()
        .expect("a header value");
    response.headers_mut().insert(header::ETAG, other);
    response
}

/// The page, or 304 when the request's validators still name it; `(etag, honour)`: whether
/// the page has an entity tag, and whether conditions are honoured at all.
fn answer(
    pages: &Mutex<Pages>,
    name: &str,
    query: &HashMap<String, usize>,
    asked: &HeaderMap,
    (with_etag, honour): (bool, bool),
) -> Response {
    let size = query.get("bytes").copied().unwrap_or(PAGE_BYTES);
    let (body, etag, modified) = current(pages, name, size);
    let header = |name| asked.get(name).and_then(|v| v.to_str().ok());
    let unchanged = match header(header::IF_NONE_MATCH) {
        Some(tags) => with_etag && tags.split(',').any(|t| same_tag(t, &etag)),
        None => header(header::IF_MODIFIED_SINCE).is_some_and(|since| not_after(&modified, since)),
    };
    let mut validators = vec![(header::LAST_MODIFIED, modified)];
    if with_etag {
        validators.push((header::ETAG, etag));
    }
    let mut pages = lock(pages);
    *pages.hits.entry(name.to_owned()).or_default() += 1;
    pages.starts.push(std::time::Instant::now());
    let mut response = if unchanged && honour {
        pages.not_modified += 1;
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        pages.full += 1;
        ([(header::CONTENT_TYPE, "text/html")], body).into_response()
    };
    for (name, value) in validators {
        response
            .headers_mut()
            .insert(name, value.parse().expect("a header value"));
    }
    response
}

/// Weak comparison (RFC 9110 8.8.3.2).
fn same_tag(asked: &str, etag: &str) -> bool {
    let asked = asked.trim();
    asked == "*" || asked.strip_prefix("W/").unwrap_or(asked) == etag
}

/// Whether the page's `Last-Modified` is not after the request's date.
fn not_after(modified: &str, since: &str) -> bool {
    match (
        httpdate::parse_http_date(modified),
        httpdate::parse_http_date(since),
    ) {
        (Ok(modified), Ok(since)) => modified <= since,
        _ => false,
    }
}
