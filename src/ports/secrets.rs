//! The secrets port: the proxies' credentials, read once per cold start and never logged.

use std::future::Future;

use crate::domain::proxy::ProxySecret;
use crate::ports::error::StoreError;

/// Where the proxies' credentials are kept.
pub trait Secrets: Send + Sync {
    /// The secret `id` names, as the proxies' credentials. Neither the secret nor its parse
    /// error quotes a credential.
    fn proxy_secret(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<ProxySecret, StoreError>> + Send;
}
