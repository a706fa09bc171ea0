//! The secrets adapter: the proxies' credentials in Secrets Manager.

use std::time::Duration;

use crate::domain::proxy::ProxySecret;
use crate::ports::error::{StoreError, StoreFault};
use crate::ports::secrets::Secrets;

/// The longest a read of the proxies' secret may take, the SDK's own retries included. The
/// read is part of a cold start: one that hangs would otherwise hold it until Lambda's init
/// timeout.
pub const SECRET_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// [`Secrets`] in AWS Secrets Manager (`GetSecretValue`, a string secret).
#[derive(Debug, Clone)]
pub struct SecretsManager {
    client: aws_sdk_secretsmanager::Client,
    timeout: Duration,
}

impl SecretsManager {
    pub fn new(client: aws_sdk_secretsmanager::Client) -> Self {
        Self {
            client,
            timeout: SECRET_READ_TIMEOUT,
        }
    }

    /// The same, with reads bounded by `timeout` instead (tests).
    pub fn within(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }
}

impl Secrets for SecretsManager {
    async fn proxy_secret(&self, arn: &str) -> Result<ProxySecret, StoreError> {
        let read = self.client.get_secret_value().secret_id(arn).send();
        let out = match tokio::time::timeout(self.timeout, read).await {
            Ok(read) => read.map_err(|e| StoreError::from_sdk("GetSecretValue", e))?,
            Err(elapsed) => {
                let fault = StoreFault::TimedOut;
                return Err(StoreError::failed("GetSecretValue", fault, elapsed));
            }
        };
        let text = out.secret_string().ok_or_else(|| StoreError::Corrupt {
            what: "proxy secret",
            detail: "it holds no string (SecretBinary is not read)".into(),
        })?;
        ProxySecret::parse(text).map_err(|detail| StoreError::Corrupt {
            what: "proxy secret",
            detail,
        })
    }
}
