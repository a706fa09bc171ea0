//! The scraper: fetches a task's URL with bounded time, size and redirects, only from the
//! public internet, and says whether a failure is worth another delivery.

mod classify;
pub mod policy;

pub use classify::{classify_status, retry_after};
pub use policy::{AddressPolicy, GuardedResolver, Lookup, Refused, SystemLookup};

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::redirect;
use url::Url;

use crate::config::Config;
use crate::domain::bounds::{ContentType, UrlText};
use crate::domain::model::Page;

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
    /// How long the site asked us to wait (`Retry-After`), when it did.
    pub retry_after: Option<Duration>,
    /// The fetch ran out of its time budget (connect or total).
    pub timed_out: bool,
}

impl FetchError {
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self::new(Retry::Permanent, reason)
    }

    pub fn transient(reason: impl Into<String>) -> Self {
        Self::new(Retry::Transient, reason)
    }

    fn new(retry: Retry, reason: impl Into<String>) -> Self {
        Self {
            retry,
            reason: reason.into(),
            http_status: None,
            retry_after: None,
            timed_out: false,
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

/// The longest task URL fetched: longer ones fail for good (browsers and CDNs stop near 8 KB).
pub const MAX_URL_BYTES: usize = 8 * 1024;

/// Fetch limits, from [`Config`].
#[derive(Debug, Clone)]
pub struct FetchSettings {
    pub connect_timeout: Duration,
    pub max_redirects: usize,
    pub max_body_bytes: u64,
    pub user_agent: String,
    pub allow_private_networks: bool,
    pub allowed_ports: Option<Vec<u16>>,
}

impl From<&Config> for FetchSettings {
    fn from(config: &Config) -> Self {
        Self {
            connect_timeout: config.connect_timeout,
            max_redirects: config.max_redirects,
            max_body_bytes: config.max_body_bytes,
            user_agent: config.user_agent.clone(),
            allow_private_networks: config.allow_private_networks,
            allowed_ports: config.allowed_ports.clone(),
        }
    }
}

/// [`Fetcher`] over one pooled reqwest client (rustls), built once per cold start.
#[derive(Debug, Clone)]
pub struct HttpFetcher {
    client: reqwest::Client,
    policy: Arc<AddressPolicy>,
    max_body_bytes: u64,
}

impl HttpFetcher {
    /// The production fetcher: the settings' address policy and the system resolver.
    pub fn new(settings: &FetchSettings) -> Result<Self, reqwest::Error> {
        let policy = AddressPolicy::new(
            settings.allow_private_networks,
            settings.allowed_ports.clone(),
        );
        Self::with_policy(settings, policy, Arc::new(SystemLookup))
    }

    /// A fetcher with its own policy and resolver (tests use a trusted address and a table).
    pub fn with_policy(
        settings: &FetchSettings,
        policy: AddressPolicy,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(policy);
        let max_redirects = settings.max_redirects;
        let hops = policy.clone();
        let redirects = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > max_redirects {
                attempt.error(Refused::TooManyRedirects(max_redirects))
            } else if let Err(refused) = hops.check_url(attempt.url()) {
                attempt.error(refused)
            } else {
                attempt.follow()
            }
        });
        let resolver = GuardedResolver {
            policy: policy.clone(),
            lookup,
        };
        // Mozilla's roots, compiled in: no reading and parsing of the system's certificate
        // store at every cold start (10+ ms), and the same trust on every host.
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok());
        let client = reqwest::Client::builder()
            .tls_certs_only(roots)
            .user_agent(settings.user_agent.clone())
            .connect_timeout(settings.connect_timeout)
            .redirect(redirects)
            .dns_resolver(Arc::new(resolver))
            .no_proxy()
            .build()?;
        Ok(Self {
            client,
            policy,
            max_body_bytes: settings.max_body_bytes,
        })
    }

    /// Reads the (decoded) body, refusing it as soon as it passes the cap: never more than
    /// the cap is held for one record.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        http_status: u16,
    ) -> Result<Bytes, FetchError> {
        let too_big = || FetchError {
            http_status: Some(http_status),
            ..FetchError::permanent(format!(
                "body exceeds MAX_BODY_BYTES ({} bytes)",
                self.max_body_bytes
            ))
        };
        let declared = response.content_length().unwrap_or(0);
        if declared > self.max_body_bytes {
            return Err(too_big());
        }
        // The declared length is only a hint (and absent when decoding); the cap is the limit.
        let mut body = CappedBody::new(declared, self.max_body_bytes);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| classify::classify_error(&e))?
        {
            body.extend(&chunk).map_err(|_| too_big())?;
        }
        Ok(body.into_bytes())
    }
}

impl Fetcher for HttpFetcher {
    #[tracing::instrument(skip_all, fields(%url))]
    async fn fetch(&self, url: &str, budget: Duration) -> Result<Page, FetchError> {
        if url.len() > MAX_URL_BYTES {
            return Err(FetchError::permanent(format!(
                "url is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        let parsed = Url::parse(url)
            .map_err(|e| FetchError::permanent(format!("url does not parse: {e}")))?;
        self.policy
            .check_url(&parsed)
            .map_err(|refused| FetchError::permanent(refused.to_string()))?;
        let requested = parsed.to_string();
        let response = self
            .client
            .get(parsed)
            .timeout(budget)
            .send()
            .await
            .map_err(|e| classify::classify_error(&e))?;
        let status = response.status();
        if let Some(retry) = classify_status(status) {
            // A redirect still standing here is one reqwest would not follow (not http(s)).
            let unfollowed = if status.is_redirection() {
                " (redirect not followed)"
            } else {
                ""
            };
            return Err(FetchError {
                http_status: Some(status.as_u16()),
                retry_after: retry_after(response.headers(), SystemTime::now()),
                ..FetchError::new(retry, format!("HTTP {}{unfollowed}", status.as_u16()))
            });
        }
        let final_url = UrlText::new(response.url().as_str());
        let content_type = ContentType::new(
            response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/octet-stream"),
        );
        let body = self.read_body(response, status.as_u16()).await?;
        Ok(Page {
            url: requested,
            http_status: status.as_u16(),
            final_url,
            content_type,
            body,
        })
    }
}

/// A body being read: never more than the cap, and never a buffer much larger than the
/// bytes read. (A `BytesMut` left to grow doubles its capacity: a page just over half the
/// cap would hold a buffer of twice the cap while its last chunk is copied in.)
#[derive(Debug)]
pub struct CappedBody {
    bytes: Vec<u8>,
    cap: usize,
}

/// The body passed its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap;

impl CappedBody {
    /// A body expected to be `declared` bytes (0 when unknown), at most `cap`.
    pub fn new(declared: u64, cap: u64) -> Self {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let declared = usize::try_from(declared).unwrap_or(usize::MAX);
        Self {
            bytes: Vec::with_capacity(declared.min(cap)),
            cap,
        }
    }

    /// Appends a chunk, growing the buffer at most to the cap.
    pub fn extend(&mut self, chunk: &[u8]) -> Result<(), OverCap> {
        let needed = self.bytes.len() + chunk.len();
        if needed > self.cap {
            return Err(OverCap);
        }
        if needed > self.bytes.capacity() {
            let grown = (self.bytes.capacity() * 2).clamp(needed, self.cap);
            self.bytes.reserve_exact(grown - self.bytes.len());
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// The bytes read, without a copy.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from(self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_of_unknown_length_never_holds_a_buffer_over_its_cap() {
        let cap = 10 * 1024 * 1024;
        let mut body = CappedBody::new(0, cap as u64);

        for _ in 0..(cap / 8192) {
            body.extend(&[7; 8192]).unwrap();
            assert!(body.capacity() <= cap, "capacity {}", body.capacity());
        }

        assert_eq!(body.into_bytes().len(), cap);
    }

    #[test]
    fn a_body_past_its_cap_is_refused_before_it_grows() {
        let mut body = CappedBody::new(0, 10_000);

        assert_eq!(body.extend(&[1; 6000]), Ok(()));
        assert_eq!(body.extend(&[1; 6000]), Err(OverCap));
        assert!(body.capacity() <= 10_000);
    }

    #[test]
    fn a_declared_length_is_reserved_once_up_to_the_cap() {
        assert_eq!(CappedBody::new(4096, 10_000).capacity(), 4096);
        assert!(CappedBody::new(u64::MAX, 10_000).capacity() <= 10_000);
    }
}
