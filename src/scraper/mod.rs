//! The scraper. It fetches a task's URL with limits on time, size and redirects, and only
//! from the public internet. It also says whether a failure is worth another delivery. This
//! file holds the HTTP fetcher. What a fetch is asked for and what it returns are in
//! `fetcher`.

mod answers;
mod body;
mod classify;
pub mod climb;
mod egress;
mod error;
mod fetcher;
mod own_proxies;
pub mod policy;
mod reuse;
mod route;
mod spans;
mod wire;

pub use classify::{classify_status, retry_after};
pub use policy::{
    AddressPolicy, Bounded, GuardedResolver, LOOKUP_TIMEOUT, Lookup, Refused, SystemLookup,
};

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::redirect;
use tracing::Instrument;
use url::Url;

use crate::domain::blocks::{BLOCK_STATUSES, BODY_WINDOW, Detection, NO_DETECTION};
use crate::domain::bounds::{ContentType, UrlText};
use crate::domain::model::{NOT_MODIFIED, Page};
use crate::domain::proxy::{ProxySecret, Tiers};
use crate::domain::refresh::Validators;
pub use body::CappedBody;
use egress::Routes;
use error::refusal_block;
pub use error::{FetchError, Retry, health_sign};
pub use fetcher::{Ask, Fetched, Fetcher, OwnMeasure};

/// The most bytes on the wire one paid fetch may use, as its proxy bills them. This is the
/// hold it takes from its run's budget, and where its relay cuts it off. A fetch is one
/// request (a redirect is a hop of its own, with a fetch of its own: docs/fetching.md). It
/// covers the page (`max_body_bytes`, as sent uncompressed) and the body of a redirect or a
/// refusal, read up to a limit before the connection is dropped. On top of that come a 64th
/// for framing (TLS records, chunks) and the request's headers, `CONNECT` and TLS handshake.
pub fn most_spent(max_body_bytes: u64) -> u64 {
    let bodies = max_body_bytes.saturating_add(egress::DRAIN_BYTES as u64);
    let framing = bodies / 64 + egress::HOP_OVERHEAD;
    bodies.saturating_add(framing)
}

pub use crate::domain::hops::MAX_URL_BYTES;

/// Fetch limits, made from the configuration by the wiring (`wiring/settings.rs`).
#[derive(Debug, Clone)]
pub struct FetchSettings {
    pub connect_timeout: Duration,
    pub max_body_bytes: u64,
    pub user_agent: String,
    pub allow_private_networks: bool,
    pub allowed_ports: Option<Vec<u16>>,
    /// Proxy tiers (none: fetches go direct) and how long a host keeps its proxy.
    pub proxies: Tiers,
    pub proxy_session: Duration,
    /// The proxies refuse private networks themselves (`PROXY_REFUSES_PRIVATE`). A target
    /// name that does not resolve here is then left to them, instead of not being fetched
    /// (and retried).
    pub proxy_refuses_private: bool,
    /// Root certificates (DER) trusted in addition to Mozilla's. None when deployed; tests
    /// add their own CA.
    pub extra_roots: Vec<Vec<u8>>,
}

/// [`Fetcher`] over pooled reqwest clients (rustls), built once per cold start: one direct,
/// or one per proxy of `PROXY_URLS`.
#[derive(Clone)]
pub struct HttpFetcher {
    /// The direct client, built at the first direct fetch: a cold start does not wait for
    /// its TLS roots and configuration, and with proxies it is never built.
    client: Arc<OnceLock<Result<reqwest::Client, String>>>,
    build: Arc<dyn Fn() -> Result<reqwest::Client, reqwest::Error> + Send + Sync>,
    routes: Option<Arc<Routes>>,
    /// The connections that have answered a request, across all clients. A request closed
    /// unanswered on one of them may be sent again.
    answered: Arc<reuse::Answered>,
    policy: Arc<AddressPolicy>,
    lookup: Arc<dyn Lookup>,
    max_body_bytes: u64,
}

impl std::fmt::Debug for HttpFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpFetcher")
            .field("proxied", &self.routes.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpFetcher {
    /// The production fetcher: the settings' address policy, the system resolver, and the
    /// proxies' credentials from `secret`.
    pub fn new(settings: &FetchSettings, secret: &ProxySecret) -> Result<Self, reqwest::Error> {
        let policy = AddressPolicy::new(
            settings.allow_private_networks,
            settings.allowed_ports.clone(),
        );
        Self::with_policy(settings, policy, Arc::new(SystemLookup))?.with_proxies(settings, secret)
    }

    /// A direct fetcher with its own policy and resolver (tests use a trusted address and a
    /// table). Every lookup through it is [`Bounded`].
    pub fn with_policy(
        settings: &FetchSettings,
        policy: AddressPolicy,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(policy);
        let lookup: Arc<dyn Lookup> = Arc::new(Bounded(lookup));
        let resolver = Arc::new(GuardedResolver {
            policy: policy.clone(),
            lookup: lookup.clone(),
        });
        let direct = settings.clone();
        let build = move || {
            client_builder(&direct)
                // Redirects are followed here, hop by hop (`fetch_direct`).
                .redirect(redirect::Policy::none())
                .dns_resolver(resolver.clone())
                .no_proxy()
                .build()
        };
        Ok(Self {
            client: Arc::new(OnceLock::new()),
            build: Arc::new(build),
            routes: None,
            answered: Arc::default(),
            policy,
            lookup,
            max_body_bytes: settings.max_body_bytes,
        })
    }

    /// Sends every fetch through the settings' proxy tiers (none: stays direct).
    pub fn with_proxies(
        mut self,
        settings: &FetchSettings,
        secret: &ProxySecret,
    ) -> Result<Self, reqwest::Error> {
        if settings.proxies.is_empty() {
            return Ok(self);
        }
        let routes = Routes::new(settings, secret, self.policy.clone(), self.lookup.clone())?;
        self.routes = Some(Arc::new(routes));
        Ok(self)
    }

    /// Reads the decoded body and refuses it as soon as it passes the cap, so no record ever
    /// holds more than the cap. With `keep_first`, only the body's first bytes are kept and
    /// the rest is left unread.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        http_status: u16,
        (received, keep_first): (&mut u64, Option<u64>),
    ) -> Result<Bytes, FetchError> {
        let too_big = || FetchError {
            http_status: Some(http_status),
            ..FetchError::permanent(format!(
                "body exceeds MAX_BODY_BYTES ({} bytes)",
                self.max_body_bytes
            ))
        };
        let declared = response.content_length().unwrap_or(0);
        if declared > self.max_body_bytes && keep_first.is_none() {
            return Err(too_big());
        }
        // The declared length is only a hint, and is absent when decoding. The cap is the
        // real limit.
        let cap = keep_first.unwrap_or(self.max_body_bytes);
        let mut body = CappedBody::new(declared, cap);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| classify::classify_error(&e))?
        {
            *received += chunk.len() as u64;
            if body.extend(&chunk).is_err() {
                let Some(first) = keep_first else {
                    return Err(too_big());
                };
                body.fill(&chunk, first);
                break;
            }
        }
        Ok(body.into_bytes())
    }

    /// The page in a response, or why there is none (its status, a block page). The body
    /// bytes read are added to `received`.
    async fn page_of(
        &self,
        response: reqwest::Response,
        (requested, ask): (String, Ask<'_>),
        received: &mut u64,
    ) -> Result<Page, FetchError> {
        let (status, reading) = (response.status().as_u16(), tokio::time::Instant::now());
        // robots.txt is read as robots.txt, whatever it looks like.
        let detection = match ask.keep_first {
            Some(_) => &NO_DETECTION,
            None => ask.detection,
        };
        if let Some(refusal) = refusal_of(&response, ask.if_changed.is_some()) {
            // Boxed: refusals are rare, and reading their body inline would make every
            // fetch's future larger.
            let refused = Box::pin(self.refused(response, refusal, detection, received));
            return Err(refused.await);
        }
        if let Some(block) = detection.by_headers(|name| header_text(response.headers(), name)) {
            return Err(FetchError::blocked_by(block, status));
        }
        let header = |name| header_text(response.headers(), name);
        let typed = header("content-type");
        let content_type = ContentType::new(typed.unwrap_or("application/octet-stream"));
        let typed = typed.is_some();
        let validators = Validators::parse(header("etag"), header("last-modified"));
        let final_url = UrlText::new(response.url().as_str());
        let body = match status {
            NOT_MODIFIED => Bytes::new(),
            _ => (self.read_body(response, status, (received, ask.keep_first))).await?,
        };
        spans::body_read(body.len(), reading.elapsed());
        let content_type_said = typed.then_some(content_type.as_str());
        if let Some(block) = detection.by_body(content_type_said, &body) {
            return Err(FetchError::blocked_by(block, status));
        }
        Ok(Page {
            url: requested,
            http_status: status,
            final_url,
            content_type,
            body,
            validators,
            rendered: None,
            screenshot: None,
        })
    }

    /// Why a direct response has no page: the block it shows, or else its status. For a
    /// status that bot managers answer with, the start of the body is read to look for
    /// their signatures.
    async fn refused(
        &self,
        response: reqwest::Response,
        refusal: FetchError,
        detection: &Detection,
        received: &mut u64,
    ) -> FetchError {
        let status = response.status().as_u16();
        let by_headers = detection.by_headers(|name| header_text(response.headers(), name));
        let content_type = header_text(response.headers(), "content-type").map(str::to_owned);
        // The body is not read for a 404, nor when the headers already showed a block.
        let read = by_headers.is_none() && !detection.is_off() && BLOCK_STATUSES.contains(&status);
        let start = match read {
            true => (self.read_body(response, status, (received, Some(BODY_WINDOW as u64))))
                .await
                .unwrap_or_default(),
            false => Bytes::new(),
        };
        let said = (status, content_type.as_deref());
        match refusal_block(detection, said, by_headers, &start) {
            Some(block) => FetchError::blocked_by(block, status),
            None => refusal,
        }
    }

    /// The direct client, built the first time a fetch needs it.
    fn direct(&self) -> Result<&reqwest::Client, FetchError> {
        let built = self
            .client
            .get_or_init(|| (self.build)().map_err(|e| e.to_string()));
        built
            .as_ref()
            .map_err(|e| FetchError::ours(format!("no HTTP client: {e}")))
    }

    /// A direct fetch, and the redirects `ask` follows, each checked as the first URL was
    /// (its address by the resolver, at connect).
    async fn fetch_direct(&self, mut url: Url, ask: Ask<'_>) -> Result<Page, FetchError> {
        let (requested, started) = (url.to_string(), tokio::time::Instant::now());
        let client = (self.direct()?, &*self.answered);
        for hop in 0..=ask.redirects {
            let left = ask.time.saturating_sub(started.elapsed());
            let response = egress::send(client, (&url, ask.if_changed), left, &mut 0)
                .await
                .map_err(|e| classify::classify_error(&e))?;
            let Some(next) = egress::redirect_target(&response) else {
                return self.page_of(response, (requested, ask), &mut 0).await;
            };
            self.policy.check_url(&next).map_err(|r| r.failure())?;
            match hop < ask.redirects {
                true => url = next,
                false if ask.redirects == 0 => {
                    return Err(FetchError::moved(response.status().as_u16(), next));
                }
                false => break,
            }
        }
        let refused = Refused::TooManyRedirects(ask.redirects);
        Err(FetchError::permanent(refused.to_string()))
    }

    /// One fetch through the proxies, or direct.
    async fn fetch_once(&self, parsed: Url, ask: Ask<'_>) -> Fetched {
        let Some(routes) = &self.routes else {
            let hop = spans::hop(0);
            let page = self.fetch_direct(parsed, ask).instrument(hop.clone()).await;
            spans::ended(&hop, &page);
            let mut fetched = Fetched::unspent(page);
            let blocked = fetched.page.as_ref().is_err_and(|e| e.block.is_some());
            fetched.spend.add_direct_blocks(u64::from(blocked));
            return fetched;
        };
        routes.fetch(self, parsed, ask).await
    }

    /// The checks that need no network: length and syntax, then the address policy's checks
    /// of scheme, credentials, port and a literal address.
    fn checked(&self, url: &str) -> Result<Url, FetchError> {
        if url.len() > MAX_URL_BYTES {
            let reason = format!("url is longer than {MAX_URL_BYTES} bytes");
            return Err(FetchError::permanent(reason));
        }
        let parsed = Url::parse(url)
            .map_err(|e| FetchError::permanent(format!("url does not parse: {e}")))?;
        self.policy
            .check_url(&parsed)
            .map_err(|refused| FetchError::permanent(refused.to_string()))?;
        Ok(parsed)
    }
}

/// A URL's host (and port, when it is not the scheme's) for spans, as the URL parser reads
/// it: never its path, query or credentials. A URL that does not parse is `invalid`.
pub fn host_of(url: &str) -> String {
    let Ok(parsed) = Url::parse(url) else {
        return "invalid".into();
    };
    match (parsed.host_str(), parsed.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_owned(),
        (None, _) => "invalid".into(),
    }
}

/// A header's value as text, if it is there and is text.
fn header_text<'h>(headers: &'h reqwest::header::HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Why a response has no page (its status), if it has none.
fn refusal(response: &reqwest::Response) -> Option<FetchError> {
    let status = response.status();
    let mut error = FetchError::of_status(status.as_u16())?;
    // A redirect that gets here was not followed (not http(s), or no Location).
    if status.is_redirection() {
        error.reason.push_str(" (redirect not followed)");
    }
    error.retry_after = retry_after(response.headers(), SystemTime::now());
    Some(error)
}

/// Why a response has no page, unless it is a `304 Not Modified` to a conditional request,
/// which confirms the earlier result.
fn refusal_of(response: &reqwest::Response, conditional: bool) -> Option<FetchError> {
    let not_modified = conditional && response.status().as_u16() == NOT_MODIFIED;
    refusal(response).filter(|_| !not_modified)
}

/// What every client shares: the user agent, the connect timeout, and Mozilla's root
/// certificates, compiled in. With compiled-in roots, the system's certificate store is not
/// read and parsed at every cold start, and every host gets the same trust.
fn client_builder(settings: &FetchSettings) -> reqwest::ClientBuilder {
    let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .map(|der| der.as_ref())
        .chain(settings.extra_roots.iter().map(Vec::as_slice))
        .filter_map(|der| reqwest::Certificate::from_der(der).ok());
    reqwest::Client::builder()
        .tls_certs_only(roots)
        .user_agent(settings.user_agent.clone())
        .connect_timeout(settings.connect_timeout)
}

impl Fetcher for HttpFetcher {
    #[tracing::instrument(skip_all, fields(host = %host_of(url)))]
    async fn fetch(&self, url: &str, ask: Ask<'_>) -> Fetched {
        let parsed = match self.checked(url) {
            Ok(parsed) => parsed,
            Err(refused) => return Fetched::unspent(Err(refused)),
        };
        self.fetch_once(parsed, ask).await
    }

    fn refuses(&self, url: &str) -> Option<FetchError> {
        self.checked(url).err()
    }

    async fn address_of(&self, url: &Url) -> Option<IpAddr> {
        let name = match url.host()? {
            url::Host::Domain(name) => name.to_owned(),
            url::Host::Ipv4(ip) => return Some(IpAddr::V4(ip)),
            url::Host::Ipv6(ip) => return Some(IpAddr::V6(ip)),
        };
        let ips = self.lookup.lookup(name).await.ok()?;
        let allowed = ips.iter().all(|ip| self.policy.check_ip(*ip).is_ok());
        ips.into_iter().min().filter(|_| allowed)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::future::BoxFuture;
    use url::Url;

    use super::{
        AddressPolicy, FetchSettings, Fetcher, HttpFetcher, LOOKUP_TIMEOUT, Lookup, host_of,
    };
    use crate::domain::proxy::Tiers;

    /// A DNS server that never answers.
    struct Silent;

    impl Lookup for Silent {
        fn lookup(&self, _host: String) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
            Box::pin(std::future::pending())
        }
    }

    fn settings() -> FetchSettings {
        FetchSettings {
            connect_timeout: Duration::from_secs(5),
            max_body_bytes: 1024,
            user_agent: "conveyor-test".into(),
            allow_private_networks: false,
            allowed_ports: None,
            proxies: Tiers::default(),
            proxy_session: Duration::from_secs(60),
            proxy_refuses_private: false,
            extra_roots: Vec::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_key_whose_name_never_resolves_is_unknown_after_the_lookup_bound() {
        // Arrange: a fetcher whose DNS server never answers.
        let policy = AddressPolicy::new(false, None);
        let fetcher =
            HttpFetcher::with_policy(&settings(), policy, Arc::new(Silent)).expect("a fetcher");
        let url = Url::parse("https://slow-dns.example/page").expect("a URL");
        let started = tokio::time::Instant::now();

        // Act
        let asked = tokio::time::timeout(Duration::from_secs(60), fetcher.address_of(&url));
        let address = asked.await.expect("the lookup gave up");

        // Assert: no address, after exactly the bound (on tokio's paused clock).
        assert_eq!(address, None);
        assert_eq!(started.elapsed(), LOOKUP_TIMEOUT);
    }

    #[test]
    fn a_urls_host_for_spans_has_no_credentials_path_or_query() {
        assert_eq!(
            host_of("https://user:pw@shop.example:8443/a?key=1#x"),
            "shop.example:8443"
        );
        assert_eq!(host_of("http://example.com?key=1"), "example.com");
        assert_eq!(host_of(r"https://h\secret/x"), "h");
        assert_eq!(host_of("not a url with a key=1"), "invalid");
    }
}
