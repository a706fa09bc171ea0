//! The address policy: a fetch reaches only the public internet. URLs are checked before a
//! request, every redirect hop again, and every resolved address before a connection.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http_acl::HttpAcl;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use super::FetchError;

/// Why a request is refused before any byte is sent. The refusal is for good
/// ([`Refused::failure`]), except for a name that could not be checked here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("url has credentials in it")]
    Userinfo,
    #[error("url has no host")]
    NoHost,
    #[error("port {0} is not in ALLOWED_PORTS")]
    Port(u16),
    #[error("address {0} is not on the public internet")]
    Address(IpAddr),
    #[error("{name} resolves to {ip}, which is not on the public internet")]
    Name { name: String, ip: IpAddr },
    #[error("more than {0} redirects")]
    TooManyRedirects(usize),
    #[error("{0} is a proxy of PROXY_URLS, not a page")]
    Proxy(String),
    #[error("a proxy's client resolves only its proxy, not {0}")]
    NotTheProxy(String),
    #[error(
        "{0} does not resolve here, so its address cannot be checked before the proxy resolves it \
         (PROXY_REFUSES_PRIVATE=true trusts the proxy to refuse private networks)"
    )]
    Unchecked(String),
}

impl Refused {
    /// The fetch's failure: permanent, except for a name that could not be checked here (it
    /// did not resolve here, or not in time). That is a DNS failure on our side, not the
    /// site's verdict, so it is transient, as a DNS failure is on a direct fetch.
    pub fn failure(&self) -> FetchError {
        match self {
            Refused::Unchecked(_) => FetchError::transient(self.to_string()),
            _ => FetchError::permanent(self.to_string()),
        }
    }
}

/// What may be fetched.
#[derive(Debug, Clone)]
pub struct AddressPolicy {
    acl: HttpAcl,
    allow_private_networks: bool,
    allowed_ports: Option<HashSet<u16>>,
    trusted: HashSet<IpAddr>,
}

impl AddressPolicy {
    /// Whether every address may be fetched (`ALLOW_PRIVATE_NETWORKS`): nothing to check.
    pub fn allows_private(&self) -> bool {
        self.allow_private_networks
    }

    /// Public addresses only (unless `allow_private_networks`), on `allowed_ports` (any if
    /// `None`).
    pub fn new(allow_private_networks: bool, allowed_ports: Option<Vec<u16>>) -> Self {
        Self {
            acl: HttpAcl::builder()
                .non_global_ip_ranges(false)
                .ip_acl_default(true)
                .build(),
            allow_private_networks,
            allowed_ports: allowed_ports.map(|ports| ports.into_iter().collect()),
            trusted: HashSet::new(),
        }
    }

    /// Lets exactly these addresses through although they are not public. Not configurable
    /// from the environment: it exists so tests can stand a "public" site on one loopback
    /// address while every other private address stays refused.
    pub fn trusting(mut self, addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        self.trusted.extend(addresses);
        self
    }

    /// Scheme, credentials, port, and the host if it is an IP literal (names are checked by
    /// [`GuardedResolver`] once resolved).
    pub fn check_url(&self, url: &Url) -> Result<(), Refused> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refused::Scheme(url.scheme().to_owned()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refused::Userinfo);
        }
        let port = url.port_or_known_default().ok_or(Refused::NoHost)?;
        if let Some(allowed) = &self.allowed_ports
            && !allowed.contains(&port)
        {
            return Err(Refused::Port(port));
        }
        match url.host().ok_or(Refused::NoHost)? {
            Host::Domain(_) => Ok(()),
            Host::Ipv4(v4) => self.check_ip(IpAddr::V4(v4)),
            Host::Ipv6(v6) => self.check_ip(IpAddr::V6(v6)),
        }
    }

    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        if self.allow_private_networks || self.trusted.contains(&ip) || is_public(&self.acl, ip) {
            Ok(())
        } else {
            Err(Refused::Address(ip))
        }
    }
}

/// Whether an address is globally routable by the IANA special-purpose registries, and not
/// multicast. The check is http-acl's, which also refuses IPv6 forms that embed IPv4
/// (mapped, compatible, NAT64, 6to4, Teredo).
fn is_public(acl: &HttpAcl, ip: IpAddr) -> bool {
    acl.is_ip_allowed(&ip).is_allowed() && !ip.is_multicast()
}

/// Turns a host name into addresses; the system resolver in production, a table in tests.
pub trait Lookup: Send + Sync + 'static {
    fn lookup(&self, host: String) -> BoxFuture<'static, io::Result<Vec<IpAddr>>>;
}

/// The system resolver, through tokio.
#[derive(Debug, Clone, Copy)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: String) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// How long a name may take to resolve before it counts as not resolving. A slow or hostile
/// DNS server costs a record this much, never its whole time.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// A lookup that gives up after [`LOOKUP_TIMEOUT`] with `TimedOut`. The fetcher wraps its
/// resolver in it, so every lookup is bounded: address keys, robots.txt, the proxy check,
/// and the HTTP client's own. (The system resolver's thread finishes by itself.)
pub struct Bounded(pub Arc<dyn Lookup>);

impl Lookup for Bounded {
    fn lookup(&self, host: String) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let resolving = self.0.lookup(host);
        Box::pin(async move {
            match tokio::time::timeout(LOOKUP_TIMEOUT, resolving).await {
                Ok(resolved) => resolved,
                Err(_) => Err(io::ErrorKind::TimedOut.into()),
            }
        })
    }
}

/// The HTTP client's resolver: resolves once, refuses the whole name if any address is
/// refused, and hands the client exactly the checked addresses, so DNS rebinding between a
/// check and the connection is impossible.
pub struct GuardedResolver {
    pub policy: Arc<AddressPolicy>,
    pub lookup: Arc<dyn Lookup>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (policy, lookup) = (self.policy.clone(), self.lookup.clone());
        Box::pin(async move {
            let name = name.as_str().to_owned();
            let ips = lookup.lookup(name.clone()).await?;
            if let Some(&ip) = ips.iter().find(|&&ip| policy.check_ip(ip).is_err()) {
                return Err(Box::new(Refused::Name { name, ip }) as _);
            }
            let addrs = ips.into_iter().map(|ip| SocketAddr::new(ip, 0));
            Ok(Box::new(addrs.collect::<Vec<_>>().into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    fn refused(policy: &AddressPolicy, url: &str) -> Option<Refused> {
        let url = Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        policy.check_url(&url).err()
    }

    /// Every way of spelling a non-public address in a URL that we know of.
    const BYPASSES: &[&str] = &[
        "http://127.0.0.1/",
        "http://127.1/",
        "http://127.0.1/",
        "http://2130706433/",
        "http://017700000001/",
        "http://0x7f000001/",
        "http://0x7f.0.0.1/",
        "http://0177.0.0.01/",
        "http://127.255.255.254/",
        "http://0/",
        "http://0.0.0.0/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://172.31.255.255/",
        "http://192.168.1.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0xa9fea9fe/",
        "http://100.64.0.1/",
        "http://100.127.255.254/",
        "http://192.0.0.1/",
        "http://192.0.2.1/",
        "http://198.51.100.1/",
        "http://203.0.113.1/",
        "http://198.18.0.1/",
        "http://240.0.0.1/",
        "http://255.255.255.255/",
        "http://224.0.0.1/",
        "http://239.255.255.250/",
        "http://[::1]/",
        "http://[::]/",
        "http://[0:0:0:0:0:0:0:1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[::127.0.0.1]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[64:ff9b:1::a00:1]/",
        "http://[2002:7f00:1::]/",
        "http://[2002:a9fe:a9fe::]/",
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
        "http://[fd00:ec2::254]/",
        "http://[fc00::1]/",
        "http://[fe80::1]/",
        "http://[ff02::1]/",
        "http://[2001:db8::1]/",
        "https://127.0.0.1:8443/",
    ];

    #[test]
    fn every_private_spelling_is_refused_and_allowed_only_by_the_switch() {
        let strict = AddressPolicy::new(false, None);
        let open = AddressPolicy::new(true, None);
        for url in BYPASSES {
            assert!(
                matches!(refused(&strict, url), Some(Refused::Address(_))),
                "{url} should be refused"
            );
            assert_eq!(
                refused(&open, url),
                None,
                "{url} with ALLOW_PRIVATE_NETWORKS"
            );
        }
        assert!(BYPASSES.len() >= 30);
    }

    #[test]
    fn public_addresses_and_names_pass() {
        let strict = AddressPolicy::new(false, None);
        for url in [
            "http://93.184.215.14/",
            "https://1.1.1.1/",
            "http://[2606:4700:4700::1111]/",
            "https://example.com/path?q=1",
            "http://example.com:8080/",
        ] {
            assert_eq!(refused(&strict, url), None, "{url}");
        }
    }

    #[test]
    fn schemes_credentials_and_ports_are_checked() {
        let policy = AddressPolicy::new(false, Some(vec![80, 443]));
        assert_eq!(
            refused(&policy, "ftp://example.com/"),
            Some(Refused::Scheme("ftp".into()))
        );
        assert_eq!(
            refused(&policy, "file:///etc/passwd"),
            Some(Refused::Scheme("file".into()))
        );
        assert_eq!(
            refused(&policy, "http://user:pw@example.com/"),
            Some(Refused::Userinfo)
        );
        assert_eq!(
            refused(&policy, "http://user@example.com/"),
            Some(Refused::Userinfo)
        );
        assert_eq!(
            refused(&policy, "http://example.com:22/"),
            Some(Refused::Port(22))
        );
        assert_eq!(refused(&policy, "http://example.com/"), None);
        assert_eq!(refused(&policy, "https://example.com:443/"), None);
    }

    #[test]
    fn a_trusted_address_passes_and_its_neighbours_do_not() {
        let policy = AddressPolicy::new(false, None).trusting(["127.0.0.2".parse().unwrap()]);
        assert_eq!(refused(&policy, "http://127.0.0.2:8080/"), None);
        assert!(refused(&policy, "http://127.0.0.1:8080/").is_some());
    }

    struct Table(Vec<IpAddr>);

    impl Lookup for Table {
        fn lookup(&self, _host: String) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
            let ips = self.0.clone();
            Box::pin(async move { Ok(ips) })
        }
    }

    async fn resolve(ips: &[&str]) -> Result<Vec<SocketAddr>, String> {
        let resolver = GuardedResolver {
            policy: Arc::new(AddressPolicy::new(false, None)),
            lookup: Arc::new(Table(ips.iter().map(|ip| ip.parse().unwrap()).collect())),
        };
        let name: Name = "host.test".parse().expect("a valid name");
        match resolver.resolve(name).await {
            Ok(addrs) => Ok(addrs.collect()),
            Err(err) => Err(err.to_string()),
        }
    }

    #[tokio::test]
    async fn a_name_with_any_private_address_is_refused_whole() {
        let err = resolve(&["93.184.215.14", "127.0.0.1"]).await.unwrap_err();
        assert_eq!(
            err,
            "host.test resolves to 127.0.0.1, which is not on the public internet"
        );
        assert!(resolve(&["::ffff:10.0.0.1"]).await.is_err());
        assert!(resolve(&["169.254.169.254"]).await.is_err());
    }

    #[tokio::test]
    async fn a_public_name_connects_to_exactly_the_checked_addresses() {
        let addrs = resolve(&["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]).await;
        let ips: Vec<_> = addrs
            .expect("public")
            .into_iter()
            .map(|a| a.ip().to_string())
            .collect();
        assert_eq!(
            ips,
            ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]
        );
    }

    proptest! {
        #[test]
        fn url_checks_never_panic_on_arbitrary_input(raw in any::<String>()) {
            let policy = AddressPolicy::new(false, Some(vec![80, 443]));
            if let Ok(url) = Url::parse(&raw) {
                let _ = policy.check_url(&url);
            }
        }

        #[test]
        fn url_checks_never_panic_on_url_shaped_input(
            scheme in "(https?|HTTPS?|ftp|file|gopher)",
            userinfo in "([a-z]{1,5}(:[a-z]{0,5})?@)?",
            host in "[0-9a-fA-Fx.:%\\[\\]]{0,45}",
            port in proptest::option::of(0_u32..70_000),
            path in "[/a-z?#=&%.]{0,20}",
        ) {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let raw = format!("{scheme}://{userinfo}{host}{port}{path}");
            let policy = AddressPolicy::new(false, Some(vec![80, 443, 8080]));
            if let Ok(url) = Url::parse(&raw) {
                let _ = policy.check_url(&url);
            }
        }

        #[test]
        fn every_spelling_of_an_ipv4_address_is_judged_alike(raw in any::<u32>()) {
            let policy = AddressPolicy::new(false, None);
            let v4 = Ipv4Addr::from(raw);
            let verdict = |spelling: String| {
                let url = Url::parse(&format!("http://{spelling}/")).expect("an IPv4 host");
                policy.check_url(&url).is_ok()
            };
            let dotted = verdict(v4.to_string());
            prop_assert_eq!(verdict(raw.to_string()), dotted);
            prop_assert_eq!(verdict(format!("{raw:#x}")), dotted);
            prop_assert_eq!(verdict(format!("0{raw:o}")), dotted);
            prop_assert_eq!(dotted, policy.check_ip(IpAddr::V4(v4)).is_ok());
            // IPv6 forms that embed it never pass, whatever it is.
            prop_assert!(policy.check_ip(IpAddr::V6(v4.to_ipv6_mapped())).is_err());
            prop_assert!(policy.check_ip(IpAddr::V6(v4.to_ipv6_compatible())).is_err());
        }
    }
}
