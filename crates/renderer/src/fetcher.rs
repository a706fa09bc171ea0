//! The renderer's fetcher: the worker's [`Fetcher`] port, answered by a browser. A page is
//! rendered in Chromium; robots.txt, and every check made before a request, go to the plain
//! fetcher, as in the worker. One browser serves the sandbox's pages, each in a context of its
//! own. It is retired after `pages_per_browser` pages, past `max_resident_bytes`, or when it
//! fails, and the next page starts a new one. With proxy tiers, a page's requests go through
//! the proxy its host sticks to, and a block climbs to the next tier, as a plain fetch does
//! (`scraper::climb`); the paid tier's hold bounds the render's bytes.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use conveyor_worker::domain::blocks::{Block, Detection};
use conveyor_worker::domain::bounds::{ContentType, UrlText};
use conveyor_worker::domain::model::Page;
use conveyor_worker::domain::proxy::{ProxyAddr, ProxySecret, Tiers, sticky};
use conveyor_worker::domain::refresh::Validators;
use conveyor_worker::domain::render::Rendering;
use conveyor_worker::domain::spend::TierSpend;
use conveyor_worker::scraper::climb::climb;
use conveyor_worker::scraper::policy::{AddressPolicy, Lookup};
use conveyor_worker::scraper::{
    Ask, FetchError, FetchSettings, Fetched, Fetcher, HttpFetcher, OwnMeasure,
};
use conveyor_worker::wiring::config::ConfigError;
use hyper::header::HeaderValue;
use tokio::sync::Mutex;
use tokio::time::Instant;
use url::Url;

use crate::browser_proxy::{Bounds, BrowserProxy, ProxyFailure, Rules, Upstream};
use crate::chromium::{Chromium, Launch, LaunchError};
use crate::render::{RenderAsk, RenderError, Rendered, Used, render};

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
    /// The proxy tiers (none: pages go direct), their credentials and session length.
    proxies: (Tiers, ProxySecret, Duration),
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
            proxies: (Tiers::default(), ProxySecret::default(), Duration::ZERO),
            slot: Mutex::new(Slot {
                chromium: None,
                pages: 0,
                refuse_all: None,
            }),
            tally: Arc::default(),
        }
    }

    /// Sends every page through the settings' proxy tiers, with the secret's credentials. The
    /// browser proxy speaks plain HTTP to a proxy: an `https://` proxy is refused here, at the
    /// cold start.
    pub fn with_proxies(
        mut self,
        fetch: &FetchSettings,
        secret: &ProxySecret,
    ) -> Result<Self, ConfigError> {
        let mut tiers = fetch.proxies.iter();
        if let Some((tier, _)) = tiers.find(|(_, p)| p.iter().any(|p| p.url().scheme() != "http")) {
            let why =
                format!("tier {tier} has an https proxy; the renderer reaches http ones only");
            return Err(ConfigError::Proxies(why));
        }
        self.proxies = (fetch.proxies.clone(), secret.clone(), fetch.proxy_session);
        Ok(self)
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

    /// The proxy of `tier` that `host` sticks to now, as the plain fetch picks it.
    fn proxy_of(&self, tier: usize, host: &str) -> Option<(usize, &ProxyAddr)> {
        let (tiers, _, session) = &self.proxies;
        let (_, proxies) = tiers.iter().nth(tier.checked_sub(1)?)?;
        let picked = sticky(host, proxies, SystemTime::now(), *session);
        Some((tier, proxies.get(picked)?))
    }

    /// Where the browser proxy sends a page's requests through `proxy`, with its credentials.
    /// A proxy's name is resolved here; it is configuration, not a page's.
    async fn upstream(&self, (tier, proxy): (usize, &ProxyAddr)) -> Result<Upstream, FetchError> {
        let url = proxy.url();
        let port = url.port_or_known_default().unwrap_or(80);
        let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
        let found = tokio::net::lookup_host((host, port)).await.ok();
        let Some(addr) = found.and_then(|mut addrs| addrs.next()) else {
            let down = FetchError::ours(format!("proxy {}: does not resolve", proxy.label()));
            return Err(FetchError {
                blocked: true,
                ..down
            });
        };
        let credentials = self.proxies.1.for_proxy(tier, proxy);
        let authorization = credentials.map(|c| {
            let token = BASE64.encode(format!("{}:{}", c.username, c.password));
            // Base64 is printable ASCII, always a valid header value.
            HeaderValue::from_str(&format!("Basic {token}")).expect("base64 is a header value")
        });
        Ok(Upstream {
            proxy: addr,
            authorization,
        })
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

    /// Renders `url` through `via` (none: direct), and says what went through the browser
    /// proxy. The paid tier's hold bounds the render's bytes.
    async fn rendered(
        &self,
        url: &Url,
        ask: Ask<'_>,
        via: Option<Upstream>,
    ) -> (Result<Page, FetchError>, Used) {
        let chromium = match self.browser().await {
            Ok(chromium) => chromium,
            Err(e) => return (Err(FetchError::ours(e.to_string())), Used::default()),
        };
        let mut rules = Rules {
            via,
            ..self.rules()
        };
        rules.bounds.bytes = rules.bounds.bytes.min(ask.wire_most.unwrap_or(u64::MAX));
        let (rendered, used) = render(&chromium, rules, &self.render_ask(url, &ask)).await;
        if let Err(RenderError::Browser(_)) = &rendered {
            self.retire(&chromium).await;
        }
        self.tally.count(&used, rendered.is_ok());
        let page = match rendered {
            Ok(rendered) => page_of(url, rendered, (&ask, &used)),
            Err(err) => Err(failure(err)),
        };
        (page.map_err(|err| blamed(err, &used)), used)
    }

    /// What the render of `url` may use: the job's options within the fetch's time, and the
    /// settings' bounds.
    fn render_ask<'a>(&self, url: &'a Url, ask: &Ask<'a>) -> RenderAsk<'a> {
        let options = ask.render;
        // The job's own time for a render, within what the fetch may take.
        let job_time = options.and_then(|o| o.timeout).unwrap_or(ask.time);
        RenderAsk {
            url: url.as_str(),
            time: ask.time.min(job_time),
            wait_for: options
                .and_then(|o| o.wait_for.as_ref())
                .map(|s| s.as_str()),
            quiet: self.settings.quiet,
            max_elements: self.settings.max_elements,
            max_html_bytes: self.settings.max_html_bytes,
            load_media: self.settings.load_media,
            screenshot: options.is_some_and(|o| o.screenshot),
        }
    }

    /// A render through each proxy tier in turn while the page is a block, as `climb` does
    /// for a plain fetch.
    async fn through_tiers(&self, url: &Url, ask: Ask<'_>) -> Fetched {
        let (host, started) = (url.host_str().unwrap_or_default(), Instant::now());
        climb(self.proxies.0.len(), &ask, |tier| {
            let proxy = self.proxy_of(tier, host)?;
            Some(async move {
                let time = ask.time.saturating_sub(started.elapsed());
                let upstream = match self.upstream(proxy).await {
                    Ok(upstream) => upstream,
                    Err(err) => return (Err(err), TierSpend::default()),
                };
                let (page, used) = self
                    .rendered(url, Ask { time, ..ask }, Some(upstream))
                    .await;
                let page = page.map_err(forbidden_is_blocked);
                let spent = TierSpend {
                    requests: used.requests,
                    bytes: used.bytes,
                    wire_bytes: used.bytes,
                    blocks: 0,
                };
                (page, spent)
            })
        })
        .await
    }
}

impl Tally {
    /// Counts one render's use of its browser proxy, and the render if it gave a page.
    fn count(&self, used: &Used, rendered: bool) {
        self.renders
            .fetch_add(u64::from(rendered), Ordering::Relaxed);
        self.requests.fetch_add(used.requests, Ordering::Relaxed);
        self.refused.fetch_add(used.refused, Ordering::Relaxed);
        self.bytes.fetch_add(used.bytes, Ordering::Relaxed);
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
        if !self.proxies.0.is_empty() {
            return Box::pin(self.through_tiers(&url, ask)).await;
        }
        let (page, _) = Box::pin(self.rendered(&url, ask, None)).await;
        let blocked = page.as_ref().is_err_and(|e| e.block.is_some());
        let mut fetched = Fetched::unspent(page);
        fetched.spend.add_direct_blocks(u64::from(blocked));
        fetched
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
fn page_of(
    url: &Url,
    rendered: Rendered,
    (ask, used): (&Ask<'_>, &Used),
) -> Result<Page, FetchError> {
    // A browser that does not say the document's status got a page.
    let status = match rendered.status {
        0 => 200,
        status => status,
    };
    if let Some(block) = blocked(ask.detection, &rendered) {
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
            requests: u32::try_from(used.requests).unwrap_or(u32::MAX),
            bytes: used.bytes,
        }),
        body: Bytes::from(rendered.html),
        screenshot: rendered.screenshot.map(Bytes::from),
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
        RenderError::Navigation(_)
        | RenderError::Browser(_)
        | RenderError::Proxy(_)
        | RenderError::Crashed => FetchError::transient(reason),
    }
}

/// A render that gave no page while the upstream proxy failed a request is blamed on the
/// proxy, as a plain fetch's is (`scraper::answers`): our failure, never the task's. A proxy
/// down or refusing a tunnel lets the next tier try; one asking for credentials does not.
fn blamed(error: FetchError, used: &Used) -> FetchError {
    let Some(failure) = used.proxy_failed else {
        return error;
    };
    let reason = |why: &str| format!("the render's proxy {why} ({})", error.reason);
    match failure {
        ProxyFailure::AuthRequired => FetchError {
            http_status: Some(407),
            ..FetchError::ours(reason("asked for credentials (HTTP 407)"))
        },
        ProxyFailure::NoConnection | ProxyFailure::TunnelRefused => FetchError {
            blocked: true,
            ..FetchError::ours(reason("gave no connection"))
        },
    }
}

/// Through a proxy, a document answered `403` is a block the next tier may get past, as a
/// plain fetch reads it. A `429` is not: a render does not see its `Retry-After`.
fn forbidden_is_blocked(error: FetchError) -> FetchError {
    match error.http_status {
        Some(403) => FetchError {
            blocked: true,
            ..error
        },
        _ => error,
    }
}

/// The block page a render met, if it did: as the site served the document (its headers,
/// then its markup), or as the page's scripts left it (a challenge drawn on the client).
fn blocked(detection: &Detection, rendered: &Rendered) -> Option<Block> {
    let served = rendered.served.as_ref();
    let by_headers = served.and_then(|s| detection.by_headers(|name| s.header(name)));
    let by_served = || served.and_then(|s| detection.by_body(s.content_type.as_deref(), &s.body));
    let by_dom = || detection.by_body(Some(RENDERED_TYPE), rendered.html.as_bytes());
    by_headers.or_else(by_served).or_else(by_dom)
}
