//! Fetching through proxy tiers. The target is checked here before anything is sent. Each
//! host sticks to one proxy in each tier. A redirect ends a page's fetch (the worker takes
//! its target's turn); robots.txt's are followed here, hop by hop, each checked again. A block moves the fetch up to the next tier. The proxy's own failures are
//! kept apart from the site's. Every request, body byte and wire byte is metered (wire
//! bytes through each proxy's relay, `wire`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::Instrument;
use url::Url;

use super::answers::{answered, maker, transport_failure};
use super::climb::climb;
use super::own_proxies::{OwnProxies, literal};
use super::reuse::Answered;
use super::route::Route;
use super::spans;
use super::wire::{self, Conn, Relay};
use super::{
    AddressPolicy, Ask, FetchError, FetchSettings, Fetched, HttpFetcher, LOOKUP_TIMEOUT, Lookup,
    Refused, classify, header_text, refusal_block, refusal_of,
};
use crate::domain::blocks::Detection;
use crate::domain::model::Page;
use crate::domain::proxy::{ProxyAddr, ProxySecret, sticky};
use crate::domain::refresh::Validators;
use crate::domain::spend::TierSpend;

/// The most of an error or redirect body read (and metered) before the connection is let go.
pub(super) const DRAIN_BYTES: usize = 64 * 1024;

/// What a paid fetch's hold allows each hop on the wire besides its body: the request and
/// response headers, `CONNECT` and a TLS handshake.
pub(super) const HOP_OVERHEAD: u64 = 16 * 1024;

/// One client per proxy, by tier.
pub(super) struct Routes {
    tiers: Vec<Vec<Route>>,
    /// The proxies, as targets are compared with them.
    own: OwnProxies,
    policy: Arc<AddressPolicy>,
    lookup: Arc<dyn Lookup>,
    settings: FetchSettings,
}

/// Requests sent and bytes received and on the wire through one proxy.
type Meter = TierSpend;

impl Routes {
    pub(super) fn new(
        settings: &FetchSettings,
        secret: &ProxySecret,
        policy: Arc<AddressPolicy>,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Self, reqwest::Error> {
        let mut tiers = Vec::new();
        for (tier, proxies) in settings.proxies.iter() {
            let routes = proxies
                .iter()
                .map(|addr| {
                    Route::new(
                        secret.for_proxy(tier, addr),
                        addr,
                        settings.proxies.marks(tier),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            tiers.push(routes);
        }
        Ok(Self {
            tiers,
            own: OwnProxies::new(&settings.proxies),
            policy,
            lookup,
            settings: settings.clone(),
        })
    }

    /// Tries the tiers in order while the response looks like a block (`climb`), within
    /// the fetch's time.
    pub(super) async fn fetch(&self, fetcher: &HttpFetcher, url: Url, ask: Ask<'_>) -> Fetched {
        if let Err(refused) = self.check_target(&url).await {
            return Fetched::unspent(Err(refused.failure()));
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        let (started, url) = (Instant::now(), &url);
        climb(self.tiers.len(), &ask, |tier| {
            let route = self.route(tier, &host)?;
            Some(async move {
                let left = ask.time.saturating_sub(started.elapsed());
                let hop = spans::hop(tier);
                let via = self.via(fetcher, route, url.clone(), (left, ask));
                let (page, meter) = via.instrument(hop.clone()).await;
                spans::ended(&hop, &page);
                (page, meter)
            })
        })
        .await
    }

    /// The proxy in `tier` (1-based) that `host` currently sticks to.
    fn route(&self, tier: usize, host: &str) -> Option<&Route> {
        let routes = self.tiers.get(tier.checked_sub(1)?)?;
        let addrs: Vec<&ProxyAddr> = routes.iter().map(|r| &r.addr).collect();
        routes.get(sticky(
            host,
            &addrs,
            SystemTime::now(),
            self.settings.proxy_session,
        ))
    }

    /// Checks the target here, before anything is sent, because the proxy resolves the
    /// name. The URL's scheme, port and literal address are checked as for a direct fetch. A
    /// proxy's own host and port are refused, however they are spelled, and so is an address
    /// at that port that the target and a proxy share here. A name that resolves here to any
    /// address that is not public is refused. A name that does not resolve here in time is
    /// not fetched either, because an attacker's DNS could answer this resolver slowly and
    /// the proxy's resolver with a private address. The exceptions: the proxies are trusted
    /// to refuse private networks (`PROXY_REFUSES_PRIVATE`), or private networks are
    /// allowed anyway. A name that does not resolve is a DNS failure, transient as on a
    /// direct fetch, not the site's verdict.
    async fn check_target(&self, url: &Url) -> Result<(), Refused> {
        self.policy.check_url(url)?;
        let proxy = |addr: &ProxyAddr| Refused::Proxy(addr.label().to_owned());
        if let Some(named) = self.own.named(url) {
            return Err(proxy(named));
        }
        let port = url.port_or_known_default().unwrap_or_default();
        let own = self.own.at(port, &self.lookup, LOOKUP_TIMEOUT);
        let (target, own) = tokio::join!(self.addresses_of(url), own);
        let name = match url.host() {
            Some(url::Host::Domain(name)) => name,
            _ => "",
        };
        let ips = match target {
            Some(ips) => ips,
            None if self.settings.proxy_refuses_private || self.policy.allows_private() => {
                return Ok(());
            }
            None => return Err(Refused::Unchecked(name.to_owned())),
        };
        if let Some(shared) = own.on(&ips) {
            return Err(proxy(shared));
        }
        match ips
            .into_iter()
            .find(|&ip| self.policy.check_ip(ip).is_err())
        {
            // A literal address was checked with the URL.
            Some(ip) if !name.is_empty() => Err(Refused::Name {
                name: name.to_owned(),
                ip,
            }),
            _ => Ok(()),
        }
    }

    /// The target's addresses: its literal address, or what its name resolves to here in
    /// time. `None` for a name that does not resolve in time, or to no address (an empty
    /// answer checks nothing).
    async fn addresses_of(&self, url: &Url) -> Option<Vec<IpAddr>> {
        if let Some(ip) = literal(url) {
            return Some(vec![ip]);
        }
        let name = url.host_str()?.to_owned();
        match self.lookup.lookup(name).await {
            Ok(ips) if !ips.is_empty() => Some(ips),
            _ => None,
        }
    }

    /// One tier's try: the request and its redirects through `route`'s proxy, and the wire
    /// bytes they used.
    async fn via(
        &self,
        fetcher: &HttpFetcher,
        route: &Route,
        url: Url,
        (time, ask): (Duration, Ask<'_>),
    ) -> (Result<Page, FetchError>, Meter) {
        let mut meter = Meter::default();
        let page = self
            .hops(fetcher, route, url, (time, ask), &mut meter)
            .await;
        (page, meter)
    }

    /// The request and the redirects `ask` follows, each hop metered into `meter`.
    async fn hops(
        &self,
        fetcher: &HttpFetcher,
        route: &Route,
        mut url: Url,
        (time, ask): (Duration, Ask<'_>),
        meter: &mut Meter,
    ) -> Result<Page, FetchError> {
        let (requested, started) = (url.to_string(), Instant::now());
        let conditional = ask.if_changed.is_some();
        let (client, relay) = route.client(&self.settings, &self.lookup)?;
        for followed in 0..=ask.redirects {
            if let Some(most) = ask.wire_most.filter(|most| meter.wire_bytes >= *most) {
                return Err(over_wire_most(most, None));
            }
            // Who answered depends on this hop. Through a tunnel (https), only the site
            // speaks once the tunnel is open. Over plain http, the proxy answers for the site.
            let tunnelled = url.scheme() == "https";
            let left = time.saturating_sub(started.elapsed());
            let answered = (client, &*fetcher.answered);
            let sent = send(answered, (&url, ask.if_changed), left, &mut meter.requests);
            let response = sent
                .await
                .map_err(|err| transport_failure(&err, &route.addr, tunnelled))?;
            let most_left = ask
                .wire_most
                .map(|most| most.saturating_sub(meter.wire_bytes));
            let wire = metered(relay, &response, (&route.addr, most_left))?;
            let hop = ((tunnelled, route), conditional, ask.detection);
            match self.hop(response, hop, wire.clone(), meter).await {
                Hop::Page(response) => {
                    return read_page(fetcher, response, (requested, ask), wire, meter).await;
                }
                Hop::Redirect(_, next) if followed < ask.redirects => url = next,
                Hop::Redirect(status, next) if ask.redirects == 0 => {
                    return Err(FetchError::moved(status, next));
                }
                Hop::Redirect(..) => break,
                Hop::Failed(err) => return Err(err),
            }
        }
        let refused = Refused::TooManyRedirects(ask.redirects);
        Err(FetchError::permanent(refused.to_string()))
    }

    /// Reads one hop's response: a redirect (its target checked as the first URL was), a
    /// refusal, or the page. A refusal is a block page, or else it is blamed on whoever
    /// answered (see `tunnelled`, and what `route`'s tier marks). A response that is not the
    /// page is read to its end, and its bytes are counted.
    async fn hop(
        &self,
        response: reqwest::Response,
        (through, conditional, detection): ((bool, &Route), bool, &Detection),
        wire: Option<Arc<Conn>>,
        meter: &mut Meter,
    ) -> Hop {
        if let Some(next) = redirect_target(&response) {
            let status = response.status().as_u16();
            discard(response, wire, meter).await;
            return match self.check_target(&next).await {
                Ok(()) => Hop::Redirect(status, next),
                Err(refused) => Hop::Failed(refused.failure()),
            };
        }
        if let Some(refused) = refusal_of(&response, conditional) {
            let refused = (refused, through, detection);
            // Boxed, like a direct refusal's read (`HttpFetcher::refused`).
            return Hop::Failed(Box::pin(refusal(response, refused, wire, meter)).await);
        }
        Hop::Page(response)
    }
}

/// What one hop's answer is: the page, a redirect (its status and target), or the end of
/// the fetch.
enum Hop {
    Page(reqwest::Response),
    Redirect(u16, Url),
    Failed(FetchError),
}

/// The relay's byte count for `response`'s connection. If there is a limit, the relay cuts
/// the connection once the fetch uses `most_left` more bytes on the wire. The relay's own
/// response saying it could not reach the proxy is a failure.
fn metered(
    relay: Option<&Relay>,
    response: &reqwest::Response,
    (proxy, most_left): (&ProxyAddr, Option<u64>),
) -> Result<Option<Arc<Conn>>, FetchError> {
    if relay.is_some_and(|relay| relay.unreachable(response)) {
        return Err(unreachable(proxy));
    }
    let wire = relay.and_then(|relay| relay.count_of(response));
    if let Some(most) = most_left {
        wire::limit(wire.as_ref(), most);
    }
    Ok(wire)
}

/// The page of the last hop's `response`, with its body and wire bytes metered. If the
/// relay cut it off at the fetch's wire limit before the body ended, the page is too large.
async fn read_page(
    fetcher: &HttpFetcher,
    response: reqwest::Response,
    (requested, ask): (String, Ask<'_>),
    wire: Option<Arc<Conn>>,
    meter: &mut Meter,
) -> Result<Page, FetchError> {
    let status = response.status().as_u16();
    let page = fetcher
        .page_of(response, (requested, ask), &mut meter.bytes)
        .await;
    let cut = ask.wire_most.filter(|_| wire::was_cut(wire.as_ref()));
    meter.wire_bytes += wire::claim(wire);
    match (page, cut) {
        (Err(_), Some(most)) => Err(over_wire_most(most, Some(status))),
        (page, _) => page,
    }
}

/// The fetch reached its wire limit (a paid fetch's hold) and its relay cut it off. Like a
/// body over `MAX_BODY_BYTES`, this fails the page for good.
fn over_wire_most(most: u64, http_status: Option<u16>) -> FetchError {
    let reason =
        format!("the page takes more than the paid tier's hold ({most} bytes on the wire)");
    FetchError {
        http_status,
        ..FetchError::permanent(reason)
    }
}

/// The relay could not reach the proxy. The tier is down, which is treated as a block the
/// next tier may get past.
fn unreachable(proxy: &ProxyAddr) -> FetchError {
    let label = proxy.label();
    FetchError {
        blocked: true,
        ..FetchError::ours(format!("proxy {label}: no connection"))
    }
}

/// How soon a request closed without an answer must fail to count as the idle-connection
/// race. A pooled connection that the peer closed while idle fails within a round trip. A
/// request that waited longer reached a peer that chose not to answer.
const IDLE_RACE: Duration = Duration::from_secs(1);

/// Sends one request. If the peer (a proxy or a site) closed a reused connection under it,
/// the request is sent once more right away, with what is left of `left`. This is the
/// idle-connection race, and a GET is safe to repeat. Only a quick close ([`IDLE_RACE`]) of
/// a connection that had answered before counts as that race. A peer that holds the request
/// and then closes without answering, or that closes a fresh connection, is not asked
/// again. It adds one to `requests` either way: a request closed in that race was never
/// read, so only the resent one can have gone further.
pub(super) async fn send(
    (client, answered): (&reqwest::Client, &Answered),
    (url, if_changed): (&Url, Option<&Validators>),
    left: Duration,
    requests: &mut u64,
) -> Result<reqwest::Response, reqwest::Error> {
    *requests += 1;
    let started = Instant::now();
    let get = |left| conditional(client.get(url.clone()).timeout(left), if_changed);
    let sent = match get(left).send().await {
        Err(err)
            if closed_unanswered(&err)
                && started.elapsed() < IDLE_RACE
                && answered.reused(&err) =>
        {
            tracing::debug!("a reused connection was closed under the request: sent once more");
            get(left.saturating_sub(started.elapsed())).send().await
        }
        sent => sent,
    };
    if let Ok(response) = &sent {
        answered.note(response);
        if *requests == 1 {
            spans::first_answer(started.elapsed());
        }
    }
    sent
}

/// The request, made conditional (only a changed page) when there are validators to send.
/// The validators are checked values (`domain::refresh`), safe to use as header values.
fn conditional(
    request: reqwest::RequestBuilder,
    if_changed: Option<&Validators>,
) -> reqwest::RequestBuilder {
    let Some(validators) = if_changed else {
        return request;
    };
    let mut request = request;
    if let Some(etag) = &validators.etag {
        request = request.header(reqwest::header::IF_NONE_MATCH, etag.as_str());
    }
    if let Some(date) = &validators.last_modified {
        request = request.header(reqwest::header::IF_MODIFIED_SINCE, date.as_str());
    }
    request
}

/// Whether the connection closed before the response was complete, by hyper's own error
/// kind.
fn closed_unanswered(err: &reqwest::Error) -> bool {
    classify::find_cause::<hyper::Error>(err).is_some_and(hyper::Error::is_incomplete_message)
}

/// Where a redirect that can be followed goes: a 301, 302, 303, 307 or 308 whose `Location`
/// is an http(s) URL (relative to the response's).
pub(super) fn redirect_target(response: &reqwest::Response) -> Option<Url> {
    let followed = [301, 302, 303, 307, 308];
    if !followed.contains(&response.status().as_u16()) {
        return None;
    }
    let location = response.headers().get(reqwest::header::LOCATION)?;
    let next = response.url().join(location.to_str().ok()?).ok()?;
    matches!(next.scheme(), "http" | "https").then_some(next)
}

/// Reads a refused response to its end. It is a block page if its headers say so, or, for a
/// status bot managers answer with, if the start of its body does. Otherwise it is the
/// refusal, blamed on whoever made it: the site, or the proxy of `route` (its tier's marks
/// say which), as seen from whether the hop was `tunnelled`.
async fn refusal(
    response: reqwest::Response,
    (refused, (tunnelled, route), detection): (FetchError, (bool, &Route), &Detection),
    wire: Option<Arc<Conn>>,
    meter: &mut Meter,
) -> FetchError {
    let headers = response.headers();
    let proxy = (&route.addr, route.marks);
    let (status, maker) = (response.status().as_u16(), maker(headers, tunnelled, proxy));
    let by_headers = detection.by_headers(|name| header_text(headers, name));
    let content_type = header_text(headers, "content-type").map(str::to_owned);
    let start = discard(response, wire, meter).await;
    let said = (status, content_type.as_deref());
    match refusal_block(detection, said, by_headers, &start) {
        Some(block) => FetchError::blocked_by(block, status),
        None => answered(refused, maker),
    }
}

/// Reads what is left of a response the fetch does not keep (a redirect, a refusal), and
/// counts its body and its connection's wire bytes. Returns the start of its body.
async fn discard(
    response: reqwest::Response,
    wire: Option<Arc<Conn>>,
    meter: &mut Meter,
) -> Vec<u8> {
    let start = drain(response).await;
    meter.bytes += start.len() as u64;
    meter.wire_bytes += wire::claim(wire);
    start
}

/// Reads up to [`DRAIN_BYTES`] of a body that is not the page, for the meter, and keeps
/// those bytes. The start of a refusal is checked for block pages.
async fn drain(mut response: reqwest::Response) -> Vec<u8> {
    let mut read = Vec::new();
    while read.len() < DRAIN_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => read.extend_from_slice(&chunk),
            _ => break,
        }
    }
    read
}
