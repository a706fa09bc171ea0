//! The local site's client-rendered pages, as a React or Vue build serves them: `/app/{name}`
//! is an application shell whose script fetches `/api/{name}` after `?delay=` milliseconds
//! (150 by default) and writes the page's text into its mount node; with `?ttfb=`, the
//! shell itself comes that many milliseconds late, as a distant site's first byte does. `/media/{file}` is an
//! image the shell shows, for the renderer's resource blocking.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;

/// The words an app page shows once its script has run, and only then: more than an
/// application shell's 80 bytes of text, as a real page's content is.
pub fn rendered_text(name: &str) -> String {
    format!(
        "rendered text of {name}: the names, prices and reviews a client-rendered shop \
         fetches after its first paint"
    )
}

pub(crate) async fn app(
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let ms = |name: &str| query.get(name).and_then(|d| d.parse::<u64>().ok());
    let delay = ms("delay").unwrap_or(150);
    tokio::time::sleep(Duration::from_millis(ms("ttfb").unwrap_or(0))).await;
    let body = format!(
        r#"<!doctype html><html><head><title>{name}</title></head><body>
<div id="root"></div><img src="/media/{name}.png" alt="">
<script>
setTimeout(() => fetch("/api/{name}").then(r => r.json()).then(d => {{
  const p = document.createElement("p"); p.className = "loaded"; p.textContent = d.text;
  document.getElementById("root").appendChild(p);
}}), {delay});
</script></body></html>"#
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body)
}

pub(crate) async fn api(Path(name): Path<String>) -> impl IntoResponse {
    // A little of the back end's own time, as an XHR takes.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let body = json!({ "text": rendered_text(&name) }).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body)
}

/// A 1x1 transparent PNG.
pub(crate) async fn media(Path(_file): Path<String>) -> impl IntoResponse {
    const PIXEL: [u8; 67] = [
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f,
        0x15, 0xc4, 0x89, 0x00, 0x00, 0x00, 0x0a, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00,
        0x01, 0x00, 0x00, 0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49,
        0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];
    ([(header::CONTENT_TYPE, "image/png")], PIXEL.to_vec())
}
