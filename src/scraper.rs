//! The scraper: fetches a task's URL with bounded time, size and redirects, and says whether a
//! failure is worth another delivery.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{StatusCode, redirect};
use url::{Host, Url};

use crate::config::Config;
use crate::model::Page;

/// Whether a failed fetch is worth another delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    Transient,
    Permanent,
}

/// A fetch that produced no page. `reason` is short and goes on the task as `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct FetchError {
    pub retry: Retry,
    pub reason: String,
    /// The response's status, when there was a response.
    pub http_status: Option<u16>,
}

impl FetchError {
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self {
            retry: Retry::Permanent,
            reason: reason.into(),
            http_status: None,
        }
    }

    pub fn transient(reason: impl Into<String>) -> Self {
        Self {
            retry: Retry::Transient,
            reason: reason.into(),
            http_status: None,
        }
    }
}

/// Fetches pages.
pub trait Fetcher: Send + Sync {
    /// Fetches `url`, giving up after `budget`.
    fn fetch(
        &self,
        url: &str,
        budget: Duration,
    ) -> impl Future<Output = Result<Page, FetchError>> + Send;
}

/// How a response status is treated: Scrapy's retry list, plus 425 Too Early.
pub fn classify_status(status: StatusCode) -> Option<Retry> {
    match status.as_u16() {
        200..=299 => None,
        408 | 425 | 429 => Some(Retry::Transient),
        500..=599 => Some(Retry::Transient),
        _ => Some(Retry::Permanent),
    }
}

/// Fetch limits, from [`Config`].
#[derive(Debug, Clone)]
pub struct FetchSettings {
    pub connect_timeout: Duration,
    pub max_redirects: usize,
    pub max_body_bytes: u64,
    pub user_agent: String,
    pub allow_private_networks: bool,
}

impl From<&Config> for FetchSettings {
    fn from(config: &Config) -> Self {
        Self {
            connect_timeout: config.connect_timeout,
            max_redirects: config.max_redirects,
            max_body_bytes: config.max_body_bytes,
            user_agent: config.user_agent.clone(),
            allow_private_networks: config.allow_private_networks,
        }
    }
}

/// [`Fetcher`] over one pooled reqwest client (rustls), built once per cold start.
#[derive(Debug, Clone)]
pub struct HttpFetcher {
    client: reqwest::Client,
    max_body_bytes: u64,
    allow_private_networks: bool,
}

impl HttpFetcher {
    pub fn new(settings: &FetchSettings) -> Result<Self, reqwest::Error> {
        let allow_private = settings.allow_private_networks;
        let max_redirects = settings.max_redirects;
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > max_redirects {
                attempt.error(Refused::TooManyRedirects(max_redirects))
            } else if let Err(refused) = check_url(attempt.url(), allow_private) {
                attempt.error(refused)
            } else {
                attempt.follow()
            }
        });
        let mut builder = reqwest::Client::builder()
            .user_agent(settings.user_agent.clone())
            .connect_timeout(settings.connect_timeout)
            .redirect(policy)
            .no_proxy();
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(PublicOnlyResolver));
        }
        Ok(Self {
            client: builder.build()?,
            max_body_bytes: settings.max_body_bytes,
            allow_private_networks: allow_private,
        })
    }

    async fn read_body(
        &self,
        mut response: reqwest::Response,
        http_status: u16,
    ) -> Result<BytesMut, FetchError> {
        let too_big = || FetchError {
            retry: Retry::Permanent,
            reason: format!(
                "body exceeds MAX_BODY_BYTES ({} bytes)",
                self.max_body_bytes
            ),
            http_status: Some(http_status),
        };
        if response
            .content_length()
            .is_some_and(|n| n > self.max_body_bytes)
        {
            return Err(too_big());
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = response.chunk().await.map_err(classify_error)? {
            if (body.len() + chunk.len()) as u64 > self.max_body_bytes {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

impl Fetcher for HttpFetcher {
    #[tracing::instrument(skip_all, fields(%url))]
    async fn fetch(&self, url: &str, budget: Duration) -> Result<Page, FetchError> {
        let parsed = Url::parse(url)
            .map_err(|e| FetchError::permanent(format!("url does not parse: {e}")))?;
        check_url(&parsed, self.allow_private_networks)
            .map_err(|refused| FetchError::permanent(refused.to_string()))?;
        let requested = parsed.to_string();
        let response = self
            .client
            .get(parsed)
            .timeout(budget)
            .send()
            .await
            .map_err(classify_error)?;
        let status = response.status();
        if let Some(retry) = classify_status(status) {
            return Err(FetchError {
                retry,
                reason: format!("HTTP {}", status.as_u16()),
                http_status: Some(status.as_u16()),
            });
        }
        let final_url = response.url().to_string();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        let body = self.read_body(response, status.as_u16()).await?;
        Ok(Page {
            url: requested,
            http_status: status.as_u16(),
            final_url,
            content_type,
            body: body.freeze(),
        })
    }
}

/// Why a URL or address is refused before any byte is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("url has no host")]
    NoHost,
    #[error("address {0} is not on the public internet")]
    Address(IpAddr),
    #[error("more than {0} redirects")]
    TooManyRedirects(usize),
}

/// Checks scheme and, unless private networks are allowed, a literal IP host.
/// Names are checked after resolution by [`PublicOnlyResolver`].
fn check_url(url: &Url, allow_private: bool) -> Result<(), Refused> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refused::Scheme(url.scheme().to_owned()));
    }
    let ip = match url.host().ok_or(Refused::NoHost)? {
        Host::Domain(_) => return Ok(()),
        Host::Ipv4(v4) => IpAddr::V4(v4),
        Host::Ipv6(v6) => IpAddr::V6(v6),
    };
    check_address(ip, allow_private)
}

fn check_address(ip: IpAddr, allow_private: bool) -> Result<(), Refused> {
    if allow_private || is_public(ip) {
        Ok(())
    } else {
        Err(Refused::Address(ip))
    }
}

/// A first line of defence: refuses loopback, private, link-local, shared, unspecified,
/// broadcast, multicast and documentation addresses, and IPv4 embedded in IPv6 is judged
/// as IPv4.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            let shared = a == 100 && (64..128).contains(&b);
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || shared
                || a == 0
                || a >= 240)
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public(IpAddr::V4(v4)),
            None => {
                !(v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unique_local()
                    || v6.is_unicast_link_local())
            }
        },
    }
}

/// Resolves names and refuses the whole name if any address is not public, so the
/// connection only ever goes to a checked address.
#[derive(Debug)]
struct PublicOnlyResolver;

impl Resolve for PublicOnlyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
                return Err(Box::new(Refused::Address(bad.ip())) as _);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Sorts a reqwest error into transient or permanent by its kind and its typed causes.
fn classify_error(err: reqwest::Error) -> FetchError {
    if let Some(refused) = find_cause::<Refused>(&err) {
        return FetchError::permanent(refused.to_string());
    }
    let cause = root_cause(&err);
    if err.is_timeout() {
        FetchError::transient("timed out")
    } else if err.is_builder() || err.is_redirect() {
        FetchError::permanent(format!("request refused: {cause}"))
    } else if err.is_connect() {
        FetchError::transient(format!("connect failed: {cause}"))
    } else {
        FetchError::transient(format!("request failed: {cause}"))
    }
}

fn find_cause<'a, T: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_retry_table() {
        let table = [
            (200, None),
            (204, None),
            (301, Some(Retry::Permanent)),
            (400, Some(Retry::Permanent)),
            (403, Some(Retry::Permanent)),
            (404, Some(Retry::Permanent)),
            (410, Some(Retry::Permanent)),
            (408, Some(Retry::Transient)),
            (425, Some(Retry::Transient)),
            (429, Some(Retry::Transient)),
            (500, Some(Retry::Transient)),
            (502, Some(Retry::Transient)),
            (503, Some(Retry::Transient)),
            (504, Some(Retry::Transient)),
            (522, Some(Retry::Transient)),
            (524, Some(Retry::Transient)),
        ];
        for (code, expected) in table {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_status(status), expected, "HTTP {code}");
        }
    }

    #[test]
    fn only_http_and_https_are_fetched() {
        for url in ["ftp://example.com/", "file:///etc/passwd", "gopher://x/"] {
            let url = Url::parse(url).unwrap();
            assert!(
                matches!(check_url(&url, true), Err(Refused::Scheme(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn private_literals_are_refused_unless_allowed() {
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://10.0.0.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://100.64.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fd00:ec2::254]/",
            "http://0.0.0.0/",
        ] {
            let parsed = Url::parse(url).unwrap();
            assert!(check_url(&parsed, false).is_err(), "{url}");
            assert!(check_url(&parsed, true).is_ok(), "{url}");
        }
        let public = Url::parse("http://93.184.215.14/").unwrap();
        assert!(check_url(&public, false).is_ok());
    }
}
