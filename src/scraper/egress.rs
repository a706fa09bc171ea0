//! Fetching through proxy tiers: the target checked here before anything is sent, the
//! host's sticky proxy in each tier, redirects followed hop by hop (each hop checked
//! again), blocks escalated to the next tier, the proxy's own failures kept apart from the
//! site's, and every request, body byte and wire byte (through each proxy's relay, `wire`)
//! metered.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use url::Url;

use super::answers::{answered, maker, transport_failure};
use super::reuse::Answered;
use super::route::Route;
use super::wire::{self, Conn, Relay};
use super::{
    AddressPolicy, Ask, FetchError, FetchSettings, Fetched, HttpFetcher, Lookup, Refused, classify,
    header_text, refusal_block, refusal_of,
};
use crate::domain::blocks::Detection;
use crate::domain::model::Page;
use crate::domain::proxy::{ProxyAddr, ProxySecret, sticky};
use crate::domain::refresh::Validators;
use crate::domain::spend::{Spend, TierSpend};

/// The reason a task fails when only the paid tier could fetch it and the run's budget for
/// that tier is spent.
pub const PAID_TIER_SPENT: &str = "the run's budget for the paid proxy tier is spent";

/// How long a target's name may take to resolve here before it counts as not resolving.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// The most of an error or redirect body read (and metered) before the connection is let go.
pub(super) const DRAIN_BYTES: usize = 64 * 1024;

/// What a paid fetch's hold allows each hop on the wire besides its body: the request and
/// response heads, `CONNECT` and a TLS handshake.
pub(super) const HOP_OVERHEAD: u64 = 16 * 1024;

/// One client per proxy, by tier.
pub(super) struct Routes {
    tiers: Vec<Vec<Route>>,
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
                .map(|addr| Route::new(secret.for_proxy(tier, addr), addr))
                .collect::<Result<Vec<_>, _>>()?;
            tiers.push(routes);
        }
        Ok(Self {
            tiers,
            policy,
            lookup,
            settings: settings.clone(),
        })
    }

    /// Tries the tiers in order while the answer looks like a block, within its time.
    pub(super) async fn fetch(&self, fetcher: &HttpFetcher, url: Url, ask: Ask<'_>) -> Fetched {
        if let Err(refused) = self.check_target(&url).await {
            return Fetched::unspent(Err(refused.failure()));
        }
        let usable = self.tiers.len() - usize::from(!ask.paid_tier);
        let withheld = usable < self.tiers.len();
        let host = url.host_str().unwrap_or_default().to_owned();
        let (started, mut spend) = (Instant::now(), Spend::default());
        let mut tier = ask.first_tier.max(1);
        while let Some(route) = self.route(tier, &host).filter(|_| tier <= usable) {
            let left = ask.time.saturating_sub(started.elapsed());
            let (page, mut meter) = self.via(fetcher, route, url.clone(), (left, ask)).await;
            meter.blocks = u64::from(page.as_ref().is_err_and(|e| e.block.is_some()));
            spend.add(tier, meter);
            match page {
                Err(err) if err.blocked && tier < usable => {
                    let proxy = route.addr.label();
                    tracing::info!(tier, %proxy, reason = %err.reason, "blocked: the next tier");
                }
                Err(err) if err.blocked && withheld => {
                    let reason = format!("{}; {PAID_TIER_SPENT}", err.reason);
                    let page = Err(FetchError { reason, ..err });
                    return Fetched {
                        page,
                        spend,
                        wants_paid_tier: true,
                    };
                }
                page => {
                    return Fetched {
                        page,
                        spend,
                        wants_paid_tier: false,
                    };
                }
            }
            tier += 1;
        }
        // No tier could be asked: the one tier there is, is the paid one.
        let page = Err(FetchError::permanent(PAID_TIER_SPENT));
        Fetched {
            page,
            spend,
            wants_paid_tier: withheld,
        }
    }

    /// The proxy of `tier` (1-based) `host` sticks to now.
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

    /// Checked here, before anything is sent, since the proxy resolves the name: the URL's
    /// scheme, port and literal address as for a direct fetch; not a proxy's own address;
    /// and a name that resolves here to any address that is not public is refused. One that
    /// does not resolve here in time is not fetched either (an attacker's DNS may answer this
    /// resolver slowly and the proxy's with a private address), unless the proxies are
    /// trusted to refuse private networks (`PROXY_REFUSES_PRIVATE`) or private networks are
    /// allowed anyway; that is a DNS failure, transient as on a direct fetch, not the site's
    /// verdict.
    async fn check_target(&self, url: &Url) -> Result<(), Refused> {
        self.policy.check_url(url)?;
        let host = url.host_str().unwrap_or_default();
        let target = format!("{host}:{}", url.port_or_known_default().unwrap_or_default());
        if self
            .tiers
            .iter()
            .flatten()
            .any(|r| r.addr.label() == target)
        {
            return Err(Refused::Proxy(target));
        }
        let Some(url::Host::Domain(name)) = url.host() else {
            return Ok(());
        };
        let resolved = tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup.lookup(name.to_owned()));
        let ips = match resolved.await {
            // An empty answer checks nothing: not fetched either.
            Ok(Ok(ips)) if !ips.is_empty() => ips,
            _ if self.settings.proxy_refuses_private || self.policy.allows_private() => {
                return Ok(());
            }
            _ => return Err(Refused::Unchecked(name.to_owned())),
        };
        match ips
            .into_iter()
            .find(|&ip| self.policy.check_ip(ip).is_err())
        {
            Some(ip) => Err(Refused::Name {
                name: name.to_owned(),
                ip,
            }),
            None => Ok(()),
        }
    }

    /// One tier's try: the request and its redirects through `route`'s proxy, and what
    /// they took of the wire.
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

    /// The request and its redirects, each hop metered into `meter`.
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
        for _ in 0..=self.settings.max_redirects {
            if let Some(most) = ask.wire_most.filter(|most| meter.wire_bytes >= *most) {
                return Err(over_wire_most(most, None));
            }
            // Who answered is this hop's question: through a tunnel (https) only the site
            // speaks once it is open; over plain http the proxy answers for the site.
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
            let hop = (tunnelled, conditional, ask.detection);
            match self.hop(response, hop, wire.clone(), meter).await {
                Hop::Page(response) => {
                    return read_page(fetcher, response, (requested, ask), wire, meter).await;
                }
                Hop::Redirect(next) => url = next,
                Hop::Failed(err) => return Err(err),
            }
        }
        let refused = Refused::TooManyRedirects(self.settings.max_redirects);
        Err(FetchError::permanent(refused.to_string()))
    }

    /// One hop's answer read: a redirect (its target checked as the first URL was), a
    /// refusal (a block page, else blamed on whoever answered: `tunnelled`), or the page. A
    /// response that is not the page is read to its end, its bytes counted.
    async fn hop(
        &self,
        response: reqwest::Response,
        (tunnelled, conditional, detection): (bool, bool, &Detection),
        wire: Option<Arc<Conn>>,
        meter: &mut Meter,
    ) -> Hop {
        if let Some(next) = redirect_target(&response) {
            discard(response, wire, meter).await;
            return match self.check_target(&next).await {
                Ok(()) => Hop::Redirect(next),
                Err(refused) => Hop::Failed(refused.failure()),
            };
        }
        if let Some(refused) = refusal_of(&response, conditional) {
            let refused = (refused, tunnelled, detection);
            // Boxed, as a direct refusal's read (`HttpFetcher::refused`).
            return Hop::Failed(Box::pin(refusal(response, refused, wire, meter)).await);
        }
        Hop::Page(response)
    }
}

/// What one hop's answer is: the page, a redirect to follow, or the end of the fetch.
enum Hop {
    Page(reqwest::Response),
    Redirect(Url),
    Failed(FetchError),
}

/// The relay's count of `response`'s connection, which it cuts once the fetch took
/// `most_left` more on the wire, if there is a most; the relay's own answer that it could
/// not reach the proxy is a failure.
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

/// The page of the last hop's `response`, its body and wire bytes metered; cut by the relay
/// at the fetch's most on the wire before its body ended, a page too large.
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

/// The fetch reached the most it may take on the wire (a paid fetch's hold) and its relay
/// cut it: as a body over `MAX_BODY_BYTES`, the page's failure for good.
fn over_wire_most(most: u64, http_status: Option<u16>) -> FetchError {
    let reason =
        format!("the page takes more than the paid tier's hold ({most} bytes on the wire)");
    FetchError {
        http_status,
        ..FetchError::permanent(reason)
    }
}

/// The relay could not reach the proxy: a tier that is down, as a block the next may pass.
fn unreachable(proxy: &ProxyAddr) -> FetchError {
    let label = proxy.label();
    FetchError {
        blocked: true,
        ..FetchError::ours(format!("proxy {label}: no connection"))
    }
}

/// How soon a closed, unanswered request must fail to be the idle connection race: a pooled
/// connection the peer closed while idle fails within a round trip; one that waited longer
/// reached a peer that chose not to answer.
const IDLE_RACE: Duration = Duration::from_secs(1);

/// One request, sent once more at once if the peer (a proxy, a site) closed a reused
/// connection under it (the idle connection race: a GET, safe to repeat), with what is left
/// of `left`. Only a prompt close ([`IDLE_RACE`]) of a connection that had answered before
/// is that race; a peer that holds the request and then closes unanswered, or closes a
/// fresh connection, is not asked again. It adds one to `requests` either way: a request
/// closed in that race was never read, so only the one sent again can have gone further.
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
    }
    sent
}

/// The request asking only for a changed page, when there are validators to ask with:
/// checked values (`domain::refresh`), safe as header values.
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

/// The connection closed before the answer was complete, by hyper's own kind.
fn closed_unanswered(err: &reqwest::Error) -> bool {
    classify::find_cause::<hyper::Error>(err).is_some_and(hyper::Error::is_incomplete_message)
}

/// Where a redirect that can be followed goes: a 301, 302, 303, 307 or 308 whose `Location`
/// is an http(s) URL (relative to the response's).
fn redirect_target(response: &reqwest::Response) -> Option<Url> {
    let followed = [301, 302, 303, 307, 308];
    if !followed.contains(&response.status().as_u16()) {
        return None;
    }
    let location = response.headers().get(reqwest::header::LOCATION)?;
    let next = response.url().join(location.to_str().ok()?).ok()?;
    matches!(next.scheme(), "http" | "https").then_some(next)
}

/// A refused answer read to its end: the block page it is (by its headers, or its body's
/// start for a status bot managers answer with), else the refusal, blamed on whoever made
/// it.
async fn refusal(
    response: reqwest::Response,
    (refused, tunnelled, detection): (FetchError, bool, &Detection),
    wire: Option<Arc<Conn>>,
    meter: &mut Meter,
) -> FetchError {
    let headers = response.headers();
    let (status, maker) = (response.status().as_u16(), maker(headers, tunnelled));
    let by_headers = detection.by_headers(|name| header_text(headers, name));
    let content_type = header_text(headers, "content-type").map(str::to_owned);
    let start = discard(response, wire, meter).await;
    let said = (status, content_type.as_deref());
    match refusal_block(detection, said, by_headers, &start) {
        Some(block) => FetchError::blocked_by(block, status),
        None => answered(refused, maker),
    }
}

/// Reads what is left of an answer the fetch does not keep (a redirect's, a refusal's),
/// counting its body and its connection's wire bytes; its body's start, kept.
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

/// Reads up to [`DRAIN_BYTES`] of a body no page is made of, for the meter, and keeps them
/// (a refusal's start is checked for block pages).
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
