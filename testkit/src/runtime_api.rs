//! A stand-in for Lambda's Runtime API, for tests that run the real `conveyor-worker`
//! binary: it hands out the given events one per `next`, keeps each response and when it
//! came, and notes when each `next` was asked. Past the last event a `next` waits, as an
//! idle sandbox does.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};

#[derive(Default)]
struct Log {
    events: VecDeque<String>,
    asked: Vec<Instant>,
    responses: Vec<(Instant, String)>,
}

type Shared = Arc<Mutex<Log>>;

pub struct RuntimeApi {
    pub addr: SocketAddr,
    log: Shared,
}

impl RuntimeApi {
    pub async fn start(events: Vec<String>) -> Self {
        let log: Shared = Arc::new(Mutex::new(Log {
            events: events.into(),
            ..Log::default()
        }));
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(answered))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(log.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the Runtime API");
        let addr = listener.local_addr().expect("an address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, log }
    }

    /// When each `next` was asked.
    pub fn asked(&self) -> Vec<Instant> {
        lock(&self.log).asked.clone()
    }

    /// Each response (or error) and when it came.
    pub fn responses(&self) -> Vec<(Instant, String)> {
        lock(&self.log).responses.clone()
    }

    /// Waits until `next` was asked `times`, at most `limit`.
    pub async fn wait_for_asks(&self, times: usize, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.asked().len() >= times {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

fn lock(log: &Shared) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn next(State(log): State<Shared>) -> (HeaderMap, String) {
    let (event, n) = {
        let mut log = lock(&log);
        log.asked.push(Instant::now());
        (log.events.pop_front(), log.asked.len())
    };
    let Some(event) = event else {
        return std::future::pending().await;
    };
    let deadline = SystemTime::now() + Duration::from_secs(60);
    let deadline = deadline
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970");
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        headers.insert(name, value.parse().expect("a header value"));
    };
    set("lambda-runtime-aws-request-id", format!("request-{n}"));
    set(
        "lambda-runtime-deadline-ms",
        deadline.as_millis().to_string(),
    );
    let arn = "arn:aws:lambda:us-east-1:123456789012:function:conveyor-worker";
    set("lambda-runtime-invoked-function-arn", arn.into());
    (headers, event)
}

async fn answered(
    State(log): State<Shared>,
    Path((_, kind)): Path<(String, String)>,
    body: String,
) -> StatusCode {
    let said = if kind == "response" {
        body
    } else {
        format!("{kind}: {body}")
    };
    lock(&log).responses.push((Instant::now(), said));
    StatusCode::ACCEPTED
}

async fn init_error(State(log): State<Shared>, body: String) -> StatusCode {
    lock(&log)
        .responses
        .push((Instant::now(), format!("init error: {body}")));
    StatusCode::ACCEPTED
}
