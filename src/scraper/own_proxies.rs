//! Whether a target is one of our own proxies, however it is spelled: by the proxy's host
//! (case, trailing dot, IDNA, default port) or by an address a proxy has here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use url::Url;

use super::Lookup;
use crate::domain::limits::Host;
use crate::domain::proxy::{ProxyAddr, Tiers};

/// How long the addresses a proxy's name resolved to are used before it is resolved again.
const KEPT: Duration = Duration::from_secs(60);

/// The proxies of every tier, as targets are compared with them.
pub(super) struct OwnProxies {
    /// Each proxy with its host key (as `Host::of` writes a politeness key) and its port.
    proxies: Vec<(String, u16, ProxyAddr)>,
    /// The addresses each proxy name resolved to here, and when.
    resolved: Mutex<HashMap<String, (Instant, Vec<IpAddr>)>>,
}

impl OwnProxies {
    pub(super) fn new(tiers: &Tiers) -> Self {
        let proxies = tiers
            .iter()
            .flat_map(|(_, proxies)| proxies)
            .map(|addr| {
                let url = addr.url();
                let key = Host::of(url).map(|host| host.as_str().to_owned());
                let port = url.port_or_known_default().unwrap_or_default();
                (
                    key.unwrap_or_else(|| addr.label().to_owned()),
                    port,
                    addr.clone(),
                )
            })
            .collect();
        Self {
            proxies,
            resolved: Mutex::default(),
        }
    }

    /// The proxy that `url`'s host and port name, however they are spelled.
    pub(super) fn named(&self, url: &Url) -> Option<&ProxyAddr> {
        let key = Host::of(url)?;
        self.proxies
            .iter()
            .find(|(own, _, _)| own == key.as_str())
            .map(|(_, _, addr)| addr)
    }

    /// The proxies listening at `port`, with their addresses here: a proxy given by its
    /// address, or one whose name resolves. The names are resolved at once, each within
    /// `timeout`. A name that does not resolve in time has no address, until it is asked
    /// again.
    pub(super) async fn at(
        &self,
        port: u16,
        lookup: &Arc<dyn Lookup>,
        timeout: Duration,
    ) -> Listening<'_> {
        let same_port = self.proxies.iter().filter(|(_, p, _)| *p == port);
        let asked = same_port
            .map(|(_, _, addr)| async move { (addr, self.addresses(addr, lookup, timeout).await) });
        Listening(futures_util::future::join_all(asked).await)
    }

    /// A proxy's addresses here: its literal address, or what its name resolves to (kept
    /// for [`KEPT`]). Every address is in its canonical form (IPv4, not IPv4-mapped).
    async fn addresses(
        &self,
        addr: &ProxyAddr,
        lookup: &Arc<dyn Lookup>,
        timeout: Duration,
    ) -> Vec<IpAddr> {
        let Some(name) = addr.name() else {
            return literal(addr.url()).into_iter().collect();
        };
        if let Some(kept) = self.kept(name) {
            return kept;
        }
        let asked = tokio::time::timeout(timeout, lookup.lookup(name.to_owned())).await;
        let Ok(Ok(ips)) = asked else {
            return Vec::new();
        };
        let ips: Vec<IpAddr> = ips.into_iter().map(|ip| ip.to_canonical()).collect();
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        resolved.insert(name.to_owned(), (Instant::now(), ips.clone()));
        ips
    }

    /// What `name` resolved to, if that was less than [`KEPT`] ago.
    fn kept(&self, name: &str) -> Option<Vec<IpAddr>> {
        let resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        let (at, ips) = resolved.get(name)?;
        (at.elapsed() < KEPT).then(|| ips.clone())
    }
}

/// The proxies at one port, with their addresses.
pub(super) struct Listening<'a>(Vec<(&'a ProxyAddr, Vec<IpAddr>)>);

impl Listening<'_> {
    /// The proxy that has one of `ips` (in any form) as its address.
    pub(super) fn on(&self, ips: &[IpAddr]) -> Option<&ProxyAddr> {
        let ips: Vec<IpAddr> = ips.iter().map(IpAddr::to_canonical).collect();
        self.0
            .iter()
            .find(|(_, own)| own.iter().any(|ip| ips.contains(ip)))
            .map(|(addr, _)| *addr)
    }
}

/// The address of a URL whose host is one, in its canonical form.
pub(super) fn literal(url: &Url) -> Option<IpAddr> {
    let ip = match url.host()? {
        url::Host::Ipv4(v4) => IpAddr::V4(v4),
        url::Host::Ipv6(v6) => IpAddr::V6(v6),
        url::Host::Domain(_) => return None,
    };
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::future::BoxFuture;

    /// Names resolved from a table, counted; `slow.example` never answers.
    #[derive(Default)]
    struct Table(AtomicUsize);

    impl Lookup for Table {
        fn lookup(&self, host: String) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match host.as_str() {
                    "proxy.example" => Ok(vec!["203.0.113.7".parse().expect("an address")]),
                    "slow.example" => std::future::pending().await,
                    _ => Err(std::io::ErrorKind::NotFound.into()),
                }
            })
        }
    }

    fn own(tiers: &str) -> OwnProxies {
        OwnProxies::new(&Tiers::parse(tiers).expect("proxy URLs"))
    }

    fn named(own: &OwnProxies, target: &str) -> Option<String> {
        let url = Url::parse(target).expect("a URL");
        own.named(&url).map(|addr| addr.label().to_owned())
    }

    #[test]
    fn a_proxys_host_is_named_however_it_is_spelled() {
        let own =
            own("http://proxy.example:3128,http://localhost:80;http://b\u{fc}cher.example:8000");

        for target in [
            "http://proxy.example:3128/",
            "http://proxy.example.:3128/status",
            "http://PROXY.Example:3128/",
            "https://proxy.example:3128/",
        ] {
            assert_eq!(
                named(&own, target).as_deref(),
                Some("proxy.example:3128"),
                "{target}"
            );
        }
        for target in ["http://localhost/", "http://LOCALHOST.:80/"] {
            assert_eq!(
                named(&own, target).as_deref(),
                Some("localhost:80"),
                "{target}"
            );
        }
        for target in [
            "http://xn--bcher-kva.example:8000/",
            "http://B\u{dc}CHER.example.:8000/",
        ] {
            assert!(named(&own, target).is_some(), "{target}");
        }
        for target in [
            "http://proxy.example/",
            "http://other.example:3128/",
            "http://localhost:81/",
        ] {
            assert_eq!(named(&own, target), None, "{target}");
        }
    }

    #[tokio::test]
    async fn an_address_a_proxy_has_here_is_the_proxy_at_its_port_only() {
        let own = own("http://proxy.example:3128;http://192.0.2.9:8000,http://slow.example:3128");
        let lookup: Arc<dyn Lookup> = Arc::new(Table::default());
        let at = |port| own.at(port, &lookup, Duration::from_millis(50));
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");

        let (at_3128, at_8000, at_80) = (at(3128).await, at(8000).await, at(80).await);

        let label = |found: Option<&ProxyAddr>| found.map(|addr| addr.label().to_owned());
        assert_eq!(
            label(at_3128.on(&[ip("203.0.113.7")])).as_deref(),
            Some("proxy.example:3128")
        );
        assert!(
            at_3128.on(&[ip("::ffff:203.0.113.7")]).is_some(),
            "an IPv4-mapped spelling"
        );
        assert_eq!(
            label(at_8000.on(&[ip("192.0.2.9")])).as_deref(),
            Some("192.0.2.9:8000")
        );
        assert!(at_8000.on(&[ip("203.0.113.7")]).is_none(), "another port");
        assert!(at_80.on(&[ip("203.0.113.7"), ip("192.0.2.9")]).is_none());
        assert!(at_3128.on(&[ip("198.51.100.1")]).is_none());
    }

    #[tokio::test]
    async fn a_proxys_name_is_resolved_within_the_timeout_and_kept_a_while() {
        let own = own("http://proxy.example:3128,http://slow.example:3128");
        let table = Arc::new(Table::default());
        let lookup: Arc<dyn Lookup> = table.clone();
        let started = Instant::now();

        for _ in 0..3 {
            own.at(3128, &lookup, Duration::from_millis(50)).await;
        }

        // The slow name is asked each time (it never answered); the other once.
        assert_eq!(table.0.load(Ordering::SeqCst), 4);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}
