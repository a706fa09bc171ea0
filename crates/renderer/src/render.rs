//! One page rendered: a browser proxy and an incognito context of its own, the document navigated
//! to, the page given time to settle, and its DOM serialized. Each step is bounded: the time
//! (`RenderAsk::time`, within the invocation's), the requests and bytes (the browser proxy's
//! [`Bounds`]), and the DOM (its elements and its serialized size).
//!
//! How a render ends:
//!
//! | what happened | result |
//! |---|---|
//! | `wait_for` showed, or (without one) the network went quiet | the page as it stands |
//! | the time ran out after the document loaded | the page as it stands (`Ended::TimedOut`) |
//! | the browser proxy's request or byte bound was reached | the page as it stands (`Ended::OverBounds`) |
//! | `wait_for` never showed | [`RenderError::NotShown`] |
//! | the document did not load in time | [`RenderError::TimedOut`] |
//! | the document's request failed (the browser proxy refused it, the site did not answer) | [`RenderError::Navigation`] |
//! | more elements or bytes than the bounds | [`RenderError::TooLarge`] |
//! | the page's renderer process crashed (out of its script memory) | [`RenderError::Crashed`] |
//! | the browser stopped answering or crashed | [`RenderError::Browser`]: the caller retires it |

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::inspector::{self, EventTargetCrashed};
use chromiumoxide::cdp::browser_protocol::network::{
    BlockPattern, EventLoadingFailed, EventLoadingFinished, EventRequestWillBeSent,
    EventResponseReceived, SetBlockedUrLsParams, SetBypassServiceWorkerParams,
};
use chromiumoxide::cdp::browser_protocol::page::CaptureScreenshotFormat;
use chromiumoxide::cdp::js_protocol::runtime::EvaluateParams;
use chromiumoxide::error::CdpError;
use chromiumoxide::listeners::EventStream;
use chromiumoxide::page::ScreenshotParams;
use futures_util::{StreamExt, stream};
use serde::Deserialize;
use tokio::time::{Instant, sleep, timeout};

use crate::browser_proxy::{BrowserProxy, ProxyFailure, Rules};
use crate::chromium::Chromium;
use crate::served::{self, Served};

/// What one render may use.
#[derive(Debug, Clone)]
pub struct RenderAsk<'a> {
    pub url: &'a str,
    /// The most time the render may take, from the browser proxy's start to the serialized DOM.
    pub time: Duration,
    /// A CSS selector the page must show before it is taken (the job's `render_wait_for`).
    pub wait_for: Option<&'a str>,
    /// How long the network must stay quiet (no request in flight) for the page to be taken.
    pub quiet: Duration,
    /// The most elements the page may have, and the most bytes its HTML may take.
    pub max_elements: u32,
    pub max_html_bytes: usize,
    /// Load images, media and fonts (off unless the settings say so).
    pub load_media: bool,
    /// Take a PNG of the page's viewport (the job's `render_screenshot`).
    pub screenshot: bool,
}

/// How the wait for the page ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// No request in flight for `quiet`, or `wait_for` showed.
    Settled,
    /// The time ran out with requests still in flight.
    TimedOut,
    /// The browser proxy's bounds were reached: it refuses the page's further requests.
    OverBounds,
}

/// A rendered page.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The serialized DOM, with its doctype.
    pub html: String,
    /// The document's own HTTP status (0 if the browser does not say).
    pub status: u16,
    pub final_url: String,
    pub ended: Ended,
    /// The viewport's PNG, if it was asked for and is within the HTML's bound.
    pub screenshot: Option<Vec<u8>>,
    /// The document as the site served it, for block detection, if the browser told of it.
    pub served: Option<Served>,
}

/// What one render sent through its browser proxy, whether or not it gave a page.
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    /// Requests allowed and refused, and the bytes carried.
    pub requests: u64,
    pub refused: u64,
    pub bytes: u64,
    /// The upstream proxy's failure, if it failed a request.
    pub proxy_failed: Option<ProxyFailure>,
}

/// A render that gave no page.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the browser failed: {0}")]
    Browser(#[from] CdpError),
    #[error("could not start the render's browser proxy: {0}")]
    Proxy(#[from] std::io::Error),
    #[error("the document did not load: {0}")]
    Navigation(String),
    #[error("the document did not load within {0:?}")]
    TimedOut(Duration),
    #[error("render_wait_for {0:?} was not shown within the render's time")]
    NotShown(String),
    #[error("the rendered page is too large ({0})")]
    TooLarge(String),
    #[error("the page's renderer process crashed (out of its script memory, say)")]
    Crashed,
}

/// Renders `ask.url` in a fresh context of `chromium`, every request through a browser proxy of
/// `rules`, and says what went through it. The context is disposed of before this returns,
/// whatever the result.
pub async fn render(
    chromium: &Chromium,
    rules: Rules,
    ask: &RenderAsk<'_>,
) -> (Result<Rendered, RenderError>, Used) {
    let proxy = match BrowserProxy::start(rules).await {
        Ok(proxy) => proxy,
        Err(err) => return (Err(err.into()), Used::default()),
    };
    let rendered = in_context(chromium, &proxy, ask).await;
    let counts = proxy.counts();
    let used = Used {
        requests: counts.allowed.load(Ordering::Relaxed),
        refused: counts.refused.load(Ordering::Relaxed),
        bytes: counts.bytes.load(Ordering::Relaxed),
        proxy_failed: counts.proxy_failed.get().copied(),
    };
    (rendered, used)
}

/// The page in a context of its own, closed before this returns.
async fn in_context(
    chromium: &Chromium,
    proxy: &BrowserProxy,
    ask: &RenderAsk<'_>,
) -> Result<Rendered, RenderError> {
    let start = Instant::now();
    let tab = chromium.tab(proxy.addr()).await?;
    let mut crashes = crashes_of(&tab.page).await?;
    let rendering = async {
        tokio::select! {
            rendered = on_page(&tab.page, proxy, ask, start) => rendered,
            Some(_) = crashes.next() => Err(RenderError::Crashed),
        }
    };
    let rendered = timeout(ask.time, rendering).await;
    // A browser that does not close a page in a second has hung: the caller retires it.
    if timeout(Duration::from_secs(1), chromium.close(tab))
        .await
        .is_err()
    {
        return Err(RenderError::Browser(CdpError::Timeout));
    }
    rendered.map_err(|_| RenderError::TimedOut(ask.time))?
}

/// The page's crashes, as the browser tells them: its renderer process died (out of
/// memory, say), and the page will never load. Told at once, not at the render's time.
async fn crashes_of(page: &Page) -> Result<EventStream<EventTargetCrashed>, CdpError> {
    page.execute(inspector::EnableParams::default()).await?;
    page.event_listener::<EventTargetCrashed>().await
}

/// Navigates, waits, and serializes, within what is left of `ask.time` since `start`.
async fn on_page(
    page: &Page,
    proxy: &BrowserProxy,
    ask: &RenderAsk<'_>,
    start: Instant,
) -> Result<Rendered, RenderError> {
    prepare(page, ask.load_media).await?;
    let mut network = InFlight::listen(page).await?;
    let mut responses = page.event_listener::<EventResponseReceived>().await?;
    if let Err(err) = page.goto(ask.url).await {
        return Err(match err {
            CdpError::ChromeMessage(text) => RenderError::Navigation(text),
            other => RenderError::Browser(other),
        });
    }
    // A tenth of the time (at most a second) is kept to serialize the page.
    let reserve = (ask.time / 10).min(Duration::from_secs(1));
    let until = start + ask.time.saturating_sub(reserve);
    let ended = network.settle(page, proxy, ask, until).await?;
    let served = served::read(page, &mut responses, ask.max_html_bytes).await;
    let mut rendered = serialize(page, ask, ended).await?;
    rendered.served = served;
    if ask.screenshot {
        rendered.screenshot = screenshot(page, ask.max_html_bytes).await?;
    }
    Ok(rendered)
}

/// A PNG of the page's viewport (800 x 600), or none if it is over `most` bytes.
async fn screenshot(page: &Page, most: usize) -> Result<Option<Vec<u8>>, CdpError> {
    let params = ScreenshotParams::builder()
        .format(CaptureScreenshotFormat::Png)
        .build();
    let png = page.screenshot(params).await?;
    if png.len() > most {
        tracing::warn!(
            bytes = png.len(),
            most,
            "the screenshot is too large to keep"
        );
        return Ok(None);
    }
    Ok(Some(png))
}

/// Closes what a page could use to get around the browser proxy or leave something behind, and
/// blocks images, media and fonts unless they are asked for.
async fn prepare(page: &Page, load_media: bool) -> Result<(), CdpError> {
    page.execute(SetBypassServiceWorkerParams::new(true))
        .await?;
    if !load_media {
        let patterns = MEDIA
            .iter()
            .map(|ext| BlockPattern::new(format!("*://*:*/*.{ext}"), true));
        let mut blocked = SetBlockedUrLsParams::builder();
        for pattern in patterns {
            blocked = blocked.url_pattern(pattern);
        }
        page.execute(blocked.build()).await?;
    }
    Ok(())
}

/// The extensions of images, media and fonts, as Crawlee's `blockRequests` lists them.
const MEDIA: [&str; 18] = [
    "png", "jpg", "jpeg", "gif", "webp", "avif", "svg", "ico", "bmp", "woff", "woff2", "ttf",
    "otf", "eot", "mp4", "webm", "mp3", "ogg",
];

/// The page's requests in flight, from the browser's network events. Each kind of event
/// comes on a stream of its own, so a request's end may be read before its start: each
/// request keeps a balance (a start is +1, an end -1; a redirect is the same request going
/// on), and it is in flight while its balance is above 0.
struct InFlight {
    events: stream::BoxStream<'static, Event>,
    /// The balance of each request not yet even, by id, with its URL once known.
    open: HashMap<String, (i32, String)>,
}

enum Event {
    Sent {
        id: String,
        url: String,
        redirect: bool,
    },
    Done(String),
}

impl InFlight {
    async fn listen(page: &Page) -> Result<Self, CdpError> {
        let sent = page.event_listener::<EventRequestWillBeSent>().await?;
        let finished = page.event_listener::<EventLoadingFinished>().await?;
        let failed = page.event_listener::<EventLoadingFailed>().await?;
        let sent = sent.map(|e| Event::Sent {
            id: e.request_id.inner().clone(),
            url: e.request.url.clone(),
            redirect: e.redirect_response.is_some(),
        });
        let finished = finished.map(|e| Event::Done(e.request_id.inner().clone()));
        let failed = failed.map(|e| Event::Done(e.request_id.inner().clone()));
        let events = stream::select(sent, stream::select(finished, failed)).boxed();
        Ok(Self {
            events,
            open: HashMap::new(),
        })
    }

    fn note(&mut self, event: Event) {
        let (id, change, url) = match event {
            Event::Sent { redirect: true, .. } => return,
            Event::Sent { id, url, .. } => (id, 1, Some(url)),
            Event::Done(id) => (id, -1, None),
        };
        let entry = self.open.entry(id.clone()).or_default();
        entry.0 += change;
        if let Some(url) = url {
            entry.1 = url;
        }
        if entry.0 == 0 {
            self.open.remove(&id);
        }
    }

    fn in_flight(&self) -> usize {
        self.open
            .values()
            .filter(|(balance, _)| *balance > 0)
            .count()
    }

    /// Waits until `wait_for` shows (when the job gave one) or else no request has been in
    /// flight for `ask.quiet`, the browser proxy's bounds are reached, or `until`.
    async fn settle(
        &mut self,
        page: &Page,
        proxy: &BrowserProxy,
        ask: &RenderAsk<'_>,
        until: Instant,
    ) -> Result<Ended, RenderError> {
        const TICK: Duration = Duration::from_millis(50);
        let mut quiet_since = Instant::now();
        // The page says when the selector shows; it is asked each tick only if it cannot.
        let mut appears = ask
            .wait_for
            .map(|selector| Box::pin(appears(page, selector)));
        let mut shown = false;
        loop {
            if proxy.counts().over.load(Ordering::Relaxed) > 0 {
                return Ok(Ended::OverBounds);
            }
            if let (Some(selector), false, None) = (ask.wait_for, shown, &appears) {
                shown = shows(page, selector).await?;
            }
            // A page the job said what to wait for is taken once it shows; any other once
            // its network has been quiet for `quiet`.
            let quiet = self.in_flight() == 0 && quiet_since.elapsed() >= ask.quiet;
            if (ask.wait_for.is_some() && shown) || (ask.wait_for.is_none() && quiet) {
                return Ok(Ended::Settled);
            }
            if Instant::now() >= until {
                return self.ran_out(shown, ask.wait_for);
            }
            let tick = sleep(TICK.min(until.saturating_duration_since(Instant::now())));
            let watched = async {
                match appears.as_mut() {
                    Some(watch) => watch.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(event) = self.events.next() => {
                    self.note(event);
                    quiet_since = Instant::now();
                }
                seen = watched => {
                    appears = None;
                    shown = seen.unwrap_or(false);
                }
                () = tick => {}
            }
        }
    }

    /// How a wait that ran out of time ends: without the selector the job waits for, the
    /// render fails; otherwise the page is taken as it stands.
    fn ran_out(&self, shown: bool, wait_for: Option<&str>) -> Result<Ended, RenderError> {
        let open: Vec<&str> = self.open.values().map(|(_, url)| url.as_str()).collect();
        tracing::debug!(
            in_flight = self.in_flight(),
            ?open,
            "the render's time ran out"
        );
        match (shown, wait_for) {
            (false, Some(selector)) => Err(RenderError::NotShown(selector.to_owned())),
            _ => Ok(Ended::TimedOut),
        }
    }
}

/// Resolves once the page shows an element `selector` matches, as the page's own
/// `MutationObserver` sees it: no polling. `false` if the selector does not parse or the
/// document went away, and then the caller asks.
async fn appears(page: &Page, selector: &str) -> Result<bool, CdpError> {
    let quoted = serde_json::to_string(selector).map_err(CdpError::from)?;
    let expression = format!(
        "new Promise(resolve => {{
          const found = () => {{ try {{ return document.querySelector({quoted}) !== null; }}
                                 catch (e) {{ return null; }} }};
          const now = found();
          if (now !== false) {{ resolve(now === true); return; }}
          const watch = new MutationObserver(() => {{
            if (found()) {{ watch.disconnect(); resolve(true); }}
          }});
          watch.observe(document, {{ childList: true, subtree: true, attributes: true }});
        }})"
    );
    evaluate::<bool>(page, expression).await
}

/// Whether the page shows an element `selector` matches.
async fn shows(page: &Page, selector: &str) -> Result<bool, CdpError> {
    // The selector goes in as a JSON string: whatever it holds, it stays a string.
    let quoted = serde_json::to_string(selector).map_err(CdpError::from)?;
    let expression = format!("document.querySelector({quoted}) !== null");
    let found = evaluate::<bool>(page, expression).await;
    // A selector the browser cannot parse throws: it never shows.
    Ok(found.unwrap_or(false))
}

/// What the page's serialization returns.
#[derive(Debug, Deserialize)]
struct Serialized {
    status: u16,
    url: String,
    elements: u32,
    html: Option<String>,
}

async fn serialize(
    page: &Page,
    ask: &RenderAsk<'_>,
    ended: Ended,
) -> Result<Rendered, RenderError> {
    // A UTF-16 unit is at most 3 bytes of UTF-8: a page of more units than the bound allows
    // at 1 byte each is too large whatever it holds, and is not sent over at all.
    let expression = format!(
        "(() => {{
          const nav = performance.getEntriesByType('navigation')[0];
          const out = {{ status: nav ? nav.responseStatus : 0, url: location.href,
                         elements: document.getElementsByTagName('*').length, html: null }};
          if (out.elements > {max_elements}) return out;
          let html = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '';
          html += document.documentElement ? document.documentElement.outerHTML : '';
          if (html.length <= {max_units}) out.html = html;
          return out;
        }})()",
        max_elements = ask.max_elements,
        max_units = ask.max_html_bytes,
    );
    let out: Serialized = evaluate(page, expression).await?;
    if out.elements > ask.max_elements {
        let most = ask.max_elements;
        return Err(RenderError::TooLarge(format!(
            "{} elements, over {most}",
            out.elements
        )));
    }
    let html = match out.html {
        Some(html) if html.len() <= ask.max_html_bytes => html,
        _ => {
            let most = ask.max_html_bytes;
            return Err(RenderError::TooLarge(format!(
                "its HTML is over {most} bytes"
            )));
        }
    };
    Ok(Rendered {
        html,
        status: out.status,
        final_url: out.url,
        ended,
        screenshot: None,
        served: None,
    })
}

/// Evaluates `expression` in the page and reads its value as `T`.
async fn evaluate<T: serde::de::DeserializeOwned>(
    page: &Page,
    expression: String,
) -> Result<T, CdpError> {
    let params = EvaluateParams::builder()
        .expression(expression)
        .await_promise(true)
        .return_by_value(true)
        .build()
        .map_err(CdpError::msg)?;
    let value = page.evaluate_expression(params).await?;
    value.into_value().map_err(CdpError::from)
}
