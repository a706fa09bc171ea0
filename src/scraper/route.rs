//! One proxy of a tier and its client, built at first use. The client reaches the proxy
//! through the proxy's relay (`wire`), which counts the bytes on the wire. The proxy's name
//! resolves to the relay. No other name resolves at all; the target's name goes to the
//! proxy.

use std::sync::{Arc, OnceLock};

use reqwest::dns::{Name, Resolve, Resolving};
use reqwest::redirect;
use url::Url;

use super::wire::{self, Relay};
use super::{FetchError, FetchSettings, Lookup, Refused, client_builder};
use crate::domain::proxy::{Credentials, Marks, ProxyAddr};

/// A proxy and its client, built at first use. A sandbox uses only the proxies its hosts
/// stick to, not all of them, and each client costs a TLS configuration and a relay.
pub(super) struct Route {
    pub(super) addr: ProxyAddr,
    /// What the proxy's tier marks: who made an unmarked answer.
    pub(super) marks: Marks,
    credentials: Option<Credentials>,
    client: OnceLock<Result<(reqwest::Client, Option<Relay>), String>>,
}

impl Route {
    pub(super) fn new(
        credentials: Option<&Credentials>,
        addr: &ProxyAddr,
        marks: Marks,
    ) -> Result<Self, reqwest::Error> {
        // Refused here, at the cold start, rather than at the proxy's first use.
        reqwest::Proxy::all(addr.url().as_str())?;
        Ok(Self {
            addr: addr.clone(),
            marks,
            credentials: credentials.cloned(),
            client: OnceLock::new(),
        })
    }

    /// The proxy's client and its relay, built the first time they are asked for.
    pub(super) fn client(
        &self,
        settings: &FetchSettings,
        lookup: &Arc<dyn Lookup>,
    ) -> Result<(&reqwest::Client, Option<&Relay>), FetchError> {
        let built = self
            .client
            .get_or_init(|| self.build(settings, lookup).map_err(|e| e.to_string()));
        let label = self.addr.label();
        built
            .as_ref()
            .map(|(client, relay)| (client, relay.as_ref()))
            .map_err(|e| FetchError::ours(format!("proxy {label}: no client: {e}")))
    }

    /// A client that reaches this proxy through its relay. The proxy's name (kept for TLS to
    /// an https proxy) resolves to the relay on loopback, at the relay's port. A proxy given
    /// by address gets the relay's address instead. An https proxy given by its address is
    /// reached directly, since TLS checks that address, so its wire bytes are not counted.
    fn build(
        &self,
        settings: &FetchSettings,
        lookup: &Arc<dyn Lookup>,
    ) -> Result<(reqwest::Client, Option<Relay>), Box<dyn std::error::Error>> {
        let url = self.addr.url();
        if url.scheme() == "https" && self.addr.name().is_none() {
            let client = self.client_via(settings, url, lookup)?;
            return Ok((client, None));
        }
        let upstream = wire::Upstream {
            host: self.addr.name().map_or_else(
                || {
                    url.host_str()
                        .unwrap_or_default()
                        .trim_matches(['[', ']'])
                        .to_owned()
                },
                str::to_owned,
            ),
            port: url.port_or_known_default().unwrap_or(80),
            lookup: lookup.clone(),
        };
        let relay = Relay::start(upstream)?;
        let mut relayed = url.clone();
        relayed
            .set_port(Some(relay.port()))
            .map_err(|()| "no port")?;
        if self.addr.name().is_none() {
            relayed.set_host(Some("127.0.0.1"))?;
        }
        let relayed_to = Arc::new(RelayLookup);
        let client = self.client_via(settings, &relayed, &(relayed_to as Arc<dyn Lookup>))?;
        Ok((client, Some(relay)))
    }

    /// A client of the proxy at `url` (its name resolved by `lookup`).
    fn client_via(
        &self,
        settings: &FetchSettings,
        url: &Url,
        lookup: &Arc<dyn Lookup>,
    ) -> Result<reqwest::Client, reqwest::Error> {
        let mut proxy = reqwest::Proxy::all(url.as_str())?;
        if let Some(credentials) = &self.credentials {
            proxy = proxy.basic_auth(&credentials.username, &credentials.password);
        }
        let resolver = ProxyResolver {
            name: self.addr.name().map(str::to_owned),
            lookup: lookup.clone(),
        };
        client_builder(settings)
            // Redirects are followed here, hop by hop, each hop checked like the first.
            .redirect(redirect::Policy::none())
            .dns_resolver(Arc::new(resolver))
            .proxy(proxy)
            .build()
    }
}

/// A proxy's client resolves only the proxy's own name (to its relay). The target's name
/// goes to the proxy, after [`Routes::check_target`] has checked it.
struct ProxyResolver {
    name: Option<String>,
    lookup: Arc<dyn Lookup>,
}

impl Resolve for ProxyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (wanted, lookup) = (self.name.clone(), self.lookup.clone());
        Box::pin(async move {
            let name = name.as_str().to_owned();
            if wanted.as_deref() != Some(name.as_str()) {
                return Err(Box::new(Refused::NotTheProxy(name)) as _);
            }
            let ips = lookup.lookup(name).await?;
            let addrs = ips.into_iter().map(|ip| std::net::SocketAddr::new(ip, 0));
            Ok(Box::new(addrs.collect::<Vec<_>>().into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The proxy's name as its relayed client resolves it: the relay, on loopback.
struct RelayLookup;

impl Lookup for RelayLookup {
    fn lookup(
        &self,
        _host: String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<std::net::IpAddr>>> {
        Box::pin(async { Ok(vec![std::net::Ipv4Addr::LOCALHOST.into()]) })
    }
}
