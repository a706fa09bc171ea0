//! A real local HTTP site on 127.0.0.1 whose pages exercise every way a fetch can end.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// Bytes served by `/big`; tests set MAX_BODY_BYTES below it.
pub const BIG_BODY: usize = 64 * 1024;

#[derive(Clone, Default)]
struct Hits(Arc<Mutex<HashMap<String, usize>>>);

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
pub struct Site {
    pub addr: SocketAddr,
    hits: Hits,
}

impl Site {
    pub async fn start() -> Self {
        let hits = Hits::default();
        let app = Router::new()
            .route("/page/{name}", get(page))
            .route("/status/{code}", get(status))
            .route("/slow/{ms}", get(slow))
            .route("/big", get(big))
            .route("/redirect/{n}", get(redirect))
            .route("/varying/{name}", get(varying))
            .layer(middleware::from_fn_with_state(hits.clone(), count_hits))
            .with_state(hits.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the local site on 127.0.0.1");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, hits }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// How often `path` was requested.
    pub fn hits(&self, path: &str) -> usize {
        self.hits.get(path)
    }
}

async fn count_hits(State(hits): State<Hits>, request: Request, next: Next) -> Response {
    hits.count(request.uri().path());
    next.run(request).await
}

async fn page(Path(name): Path<String>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        format!("<html><body>page {name}</body></html>"),
    )
}

async fn status(Path(code): Path<u16>) -> impl IntoResponse {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    (code, format!("status {code}"))
}

async fn slow(Path(ms): Path<u64>) -> impl IntoResponse {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "slow page"
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
