//! The renderer's fetcher: the worker's [`Fetcher`] port, answered by a browser. A page is
//! rendered in Chromium; robots.txt, and every check made before a request, go to the plain
//! fetcher, as in the worker. One browser serves the sandbox's pages, each in a context of its
//! own. It is retired after `pages_per_browser` pages, past `max_resident_bytes`, or when it
//! fails, and the next page starts a new one.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use conveyor_worker::domain::bounds::{ContentType, UrlText};
use conveyor_worker::domain::model::Page;
use conveyor_worker::domain::refresh::Validators;
use conveyor_worker::domain::render::Rendering;
use conveyor_worker::scraper::policy::{AddressPolicy, Lookup};
use conveyor_worker::scraper::{Ask, FetchError, Fetched, Fetcher, HttpFetcher, OwnMeasure};
use tokio::sync::Mutex;
use url::Url;

use crate::browser_proxy::{Bounds, BrowserProxy, Rules};
use crate::chromium::{Chromium, Launch, LaunchError};
use crate::render::{RenderAsk, RenderError, Rendered, render};

/// The renderer's settings, from its configuration (`settings.rs`).
#[derive(Debug, Clone)]
pub struct RenderSettings {
    pub launch: Launch,
    /// The most pages one browser renders before it is retired.
    pub pages_per_browser: u64,
    /// The most memory the browser's processes may hold before it is retired.
    pub max_resident_bytes: u64,
    /// The most one page may ask for through the browser proxy.
    pub bounds: Bounds,
    pub max_elements: u32,
    pub max_html_bytes: usize,
    /// How long the network must stay quiet for a page to be taken.
    pub quiet: Duration,
    pub load_media: bool,
}

/// What the sandbox's browser has done since the last batch, for the renderer's metrics.
#[derive(Debug, Default)]
pub struct Tally {
    pub renders: AtomicU64,
    /// Requests the browser proxy let through for the sandbox's pages.
    pub requests: AtomicU64,
    pub launches: AtomicU64,
    pub retired: AtomicU64,
    pub refused: AtomicU64,
    pub bytes: AtomicU64,
}

/// The browser the sandbox's pages share, and how many pages it has rendered.
struct Slot {
    chromium: Option<Arc<Chromium>>,
    pages: u64,
    /// The browser's own proxy: it refuses everything (`chromium.rs`).
    refuse_all: Option<BrowserProxy>,
}

/// [`Fetcher`] through a browser; robots.txt and the checks through `plain`.
pub struct BrowserFetcher {
    plain: HttpFetcher,
    policy: Arc<AddressPolicy>,
    lookup: Arc<dyn Lookup>,
    settings: RenderSettings,
    slot: Mutex<Slot>,
    pub tally: Arc<Tally>,
}

impl std::fmt::Debug for BrowserFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrowserFetcher").finish_non_exhaustive()
    }
}

impl BrowserFetcher {
    /// `plain` checks URLs and fetches robots.txt; the browser proxy applies `policy` with `lookup`,
    /// as `plain` does.
    pub fn new(
        plain: HttpFetcher,
        (policy, lookup): (AddressPolicy, Arc<dyn Lookup>),
        settings: RenderSettings,
    ) -> Self {
        Self {
            plain,
            policy: Arc::new(policy),
            lookup,
            settings,
            slot: Mutex::new(Slot {
                chromium: None,
                pages: 0,
                refuse_all: None,
            }),
            tally: Arc::default(),
        }
    }

    /// The sandbox's browser, started (or replaced) when there is none fit to use.
    async fn browser(&self) -> Result<Arc<Chromium>, LaunchError> {
        let mut slot = self.slot.lock().await;
        let worn = slot.pages >= self.settings.pages_per_browser;
        let fit = slot.chromium.as_ref().is_some_and(|c| {
            c.alive() && !worn && c.resident_bytes() <= self.settings.max_resident_bytes
        });
        if !fit {
            if slot.chromium.take().is_some() {
                self.tally.retired.fetch_add(1, Ordering::Relaxed);
            }
            let refuse_all = match &slot.refuse_all {
                Some(proxy) => proxy.addr(),
                None => slot
                    .refuse_all
                    .insert(BrowserProxy::start(self.refusing()).await?)
                    .addr(),
            };
            let started = Chromium::launch(&self.settings.launch, refuse_all).await?;
            self.tally.launches.fetch_add(1, Ordering::Relaxed);
            slot.chromium = Some(Arc::new(started));
            slot.pages = 0;
        }
        slot.pages += 1;
        // Set just above when it was not fit.
        Ok(Arc::clone(
            slot.chromium.as_ref().expect("a browser was started"),
        ))
    }

    /// Kills the sandbox's browser with its processes and reaps it, when no page uses it
    /// (the end of a benchmark; a sandbox's browser otherwise ends with the sandbox).
    pub async fn close(&self) {
        let chromium = self.slot.lock().await.chromium.take();
        if let Some(chromium) = chromium.and_then(|c| Arc::try_unwrap(c).ok()) {
            chromium.kill().await;
        }
    }

    /// Retires `broken` if it is still the sandbox's browser. Its processes are killed when
    /// the last page using it lets go of it.
    async fn retire(&self, broken: &Arc<Chromium>) {
        let mut slot = self.slot.lock().await;
        if slot
            .chromium
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, broken))
        {
            slot.chromium = None;
            self.tally.retired.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn rules(&self) -> Rules {
        Rules {
            policy: Arc::clone(&self.policy),
            lookup: Arc::clone(&self.lookup),
            bounds: self.settings.bounds,
            via: None,
        }
    }

    fn refusing(&self) -> Rules {
        let bounds = Bounds {
            requests: 0,
            bytes: 0,
        };
        Rules {
            bounds,
            ..self.rules()
        }
    }

    async fn rendered(&self, url: &Url, ask: Ask<'_>) -> Result<Page, FetchError> {
        let chromium = self
            .browser()
            .await
            .map_err(|e| FetchError::ours(e.to_string()))?;
        let options = ask.render;
        // The job's own time for a render, within what the fetch may take.
        let job_time = options.and_then(|o| o.timeout).unwrap_or(ask.time);
        let render_ask = RenderAsk {
            url: url.as_str(),
            time: ask.time.min(job_time),
            wait_for: options
                .and_then(|o| o.wait_for.as_ref())
                .map(|s| s.as_str()),
            quiet: self.settings.quiet,
            max_elements: self.settings.max_elements,
            max_html_bytes: self.settings.max_html_bytes,
            load_media: self.settings.load_media,
        };
        let rendered = render(&chromium, self.rules(), &render_ask).await;
        if let Err(RenderError::Browser(_)) = &rendered {
            self.retire(&chromium).await;
        }
        let rendered = rendered.map_err(failure)?;
        self.tally.renders.fetch_add(1, Ordering::Relaxed);
        self.tally
            .requests
            .fetch_add(rendered.requests, Ordering::Relaxed);
        self.tally
            .refused
            .fetch_add(rendered.refused, Ordering::Relaxed);
        self.tally
            .bytes
            .fetch_add(rendered.bytes, Ordering::Relaxed);
        page_of(url, rendered, ask)
    }
}

impl Fetcher for BrowserFetcher {
    async fn fetch(&self, url: &str, ask: Ask<'_>) -> Fetched {
        if ask.keep_first.is_some() {
            return self.plain.fetch(url, ask).await;
        }
        let url = match Url::parse(url) {
            Ok(url) => url,
            Err(e) => return Fetched::unspent(Err(FetchError::permanent(e.to_string()))),
        };
        // Boxed: a render's future is deep, and one allocation is nothing beside a browser.
        Fetched::unspent(Box::pin(self.rendered(&url, ask)).await)
    }

    fn refuses(&self, url: &str) -> Option<FetchError> {
        self.plain.refuses(url)
    }

    async fn address_of(&self, url: &Url) -> Option<IpAddr> {
        self.plain.address_of(url).await
    }

    /// The sandbox's browser since the last batch: its renders and what went through their
    /// browser proxies, and the browsers started and retired. A render's time is the
    /// invocation's `FetchLatency`.
    fn take_measures(&self) -> Vec<OwnMeasure> {
        let take = |counter: &AtomicU64| counter.swap(0, Ordering::Relaxed);
        let tally = &self.tally;
        vec![
            ("Renders", "Count", take(&tally.renders)),
            ("BrowserLaunches", "Count", take(&tally.launches)),
            ("BrowsersRetired", "Count", take(&tally.retired)),
            ("BrowserProxyRequests", "Count", take(&tally.requests)),
            ("BrowserProxyRefused", "Count", take(&tally.refused)),
            ("BrowserProxyBytes", "Bytes", take(&tally.bytes)),
        ]
    }
}

/// The content type of every rendered page: the DOM serialized as UTF-8.
pub const RENDERED_TYPE: &str = "text/html; charset=utf-8";

/// The page a render gave, or why it is not one (its status, a block page), as the plain
/// fetch tells them.
fn page_of(url: &Url, rendered: Rendered, ask: Ask<'_>) -> Result<Page, FetchError> {
    // A browser that does not say the document's status got a page.
    let status = match rendered.status {
        0 => 200,
        status => status,
    };
    if let Some(block) = ask
        .detection
        .by_body(Some(RENDERED_TYPE), rendered.html.as_bytes())
    {
        return Err(FetchError::blocked_by(block, status));
    }
    if let Some(refusal) = FetchError::of_status(status) {
        return Err(refusal);
    }
    Ok(Page {
        url: url.as_str().to_owned(),
        http_status: status,
        final_url: UrlText::new(&rendered.final_url),
        content_type: ContentType::new(RENDERED_TYPE),
        validators: Validators::default(),
        rendered: Some(Rendering {
            requests: u32::try_from(rendered.requests).unwrap_or(u32::MAX),
            bytes: rendered.bytes,
        }),
        body: Bytes::from(rendered.html),
    })
}

/// How a render that gave no page is retried: the browser's own failures and a page that did
/// not load or show in time are tried again; a page too large never will be smaller.
fn failure(error: RenderError) -> FetchError {
    let reason = error.to_string();
    match error {
        RenderError::TooLarge(_) => FetchError::permanent(reason),
        RenderError::TimedOut(_) | RenderError::NotShown(_) => FetchError {
            timed_out: true,
            ..FetchError::transient(reason)
        },
        RenderError::Navigation(_) | RenderError::Browser(_) | RenderError::Proxy(_) => {
            FetchError::transient(reason)
        }
    }
}
