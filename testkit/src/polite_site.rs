//! A local site that keeps a log of its requests, to check what the fleet does to it: when
//! each started and ended, how many were in flight at once, and a robots.txt and push-backs
//! a test sets. Its `/to/<host:port>/<path>` redirects there, as a link shortener does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One request: its path, and when it arrived and was answered (or dropped: a client that
/// gives up closes its connection, and the server stops serving it).
#[derive(Debug, Clone)]
pub struct Visit {
    pub path: String,
    pub started: Instant,
    pub ended: Instant,
}

/// What the site answers: its robots.txt (status, body), how long a page takes, how many
/// of the next page requests it refuses with 429 and `Retry-After` seconds, and how many
/// after those it answers with a bare 503 (after the page's time).
#[derive(Debug, Clone)]
pub struct Behaviour {
    pub robots: (u16, String),
    pub page_time: Duration,
    pub refuse_next: (usize, u64),
    pub fail_next: usize,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            robots: (404, String::new()),
            page_time: Duration::from_millis(100),
            refuse_next: (0, 0),
            fail_next: 0,
        }
    }
}

#[derive(Debug, Default)]
struct Log {
    visits: Vec<Visit>,
    in_flight: usize,
    most_in_flight: usize,
    behaviour: Behaviour,
}

/// A running logged site; it stops with the test's runtime.
#[derive(Clone)]
pub struct PoliteSite {
    addr: SocketAddr,
    log: Arc<Mutex<Log>>,
}

impl PoliteSite {
    pub async fn start(behaviour: Behaviour) -> Self {
        let log = Arc::new(Mutex::new(Log {
            behaviour,
            ..Log::default()
        }));
        let app = Router::new().fallback(serve).with_state(log.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("a bound address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The URL on this site (a shortener) that redirects to `target`'s `path`.
    pub fn link_to(&self, target: &PoliteSite, path: &str) -> String {
        self.url(&format!("/to/{}{path}", target.addr))
    }

    pub fn set(&self, change: impl FnOnce(&mut Behaviour)) {
        change(&mut lock(&self.log).behaviour);
    }

    pub fn visits(&self) -> Vec<Visit> {
        lock(&self.log).visits.clone()
    }

    pub fn hits(&self, prefix: &str) -> usize {
        self.visits()
            .iter()
            .filter(|v| v.path.starts_with(prefix))
            .count()
    }

    /// The most requests in flight at once.
    pub fn most_in_flight(&self) -> usize {
        lock(&self.log).most_in_flight
    }

    /// The most requests that started within any window of `width` (both ends included).
    pub fn most_started_within(&self, width: Duration) -> usize {
        most_started_within(&[self], width)
    }
}

/// The most requests that started within any window of `width` on these sites together.
pub fn most_started_within(sites: &[&PoliteSite], width: Duration) -> usize {
    let mut starts: Vec<Instant> = sites
        .iter()
        .flat_map(|site| site.visits().into_iter().map(|v| v.started))
        .collect();
    starts.sort();
    (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|s| **s - starts[i] <= width)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

async fn serve(State(log): State<Arc<Mutex<Log>>>, request: Request) -> Response {
    let (path, started) = (request.uri().path().to_owned(), Instant::now());
    let behaviour = {
        let mut log = lock(&log);
        log.in_flight += 1;
        log.most_in_flight = log.most_in_flight.max(log.in_flight);
        let behaviour = log.behaviour.clone();
        if path != "/robots.txt" {
            let next = &mut log.behaviour;
            if next.refuse_next.0 > 0 {
                next.refuse_next.0 -= 1;
            } else {
                next.fail_next = next.fail_next.saturating_sub(1);
            }
        }
        behaviour
    };
    let serving = Serving { log, path, started };
    answer(&serving.path, &behaviour).await
}

/// A request in flight: it ends when it is answered or when the server drops it (its client
/// closed the connection), so a request a client gave up on is not counted in flight for
/// ever.
struct Serving {
    log: Arc<Mutex<Log>>,
    path: String,
    started: Instant,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut log = lock(&self.log);
        log.in_flight -= 1;
        log.visits.push(Visit {
            path: std::mem::take(&mut self.path),
            started: self.started,
            ended: Instant::now(),
        });
    }
}

async fn answer(path: &str, behaviour: &Behaviour) -> Response {
    if path == "/robots.txt" {
        let (status, body) = &behaviour.robots;
        let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::OK);
        return (status, body.clone()).into_response();
    }
    // A shortener: `/to/<host:port>/<path>` answers 301 to `http://<host:port>/<path>`.
    if let Some(target) = path.strip_prefix("/to/") {
        let location = [(header::LOCATION, format!("http://{target}"))];
        return (StatusCode::MOVED_PERMANENTLY, location).into_response();
    }
    if let (1.., seconds) = behaviour.refuse_next {
        let retry_after = [(header::RETRY_AFTER, seconds.to_string())];
        return (StatusCode::TOO_MANY_REQUESTS, retry_after, "slow down").into_response();
    }
    tokio::time::sleep(behaviour.page_time).await;
    if behaviour.fail_next > 0 {
        return (StatusCode::SERVICE_UNAVAILABLE, "unavailable").into_response();
    }
    format!("page {path}").into_response()
}
