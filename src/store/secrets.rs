//! The secrets adapter: the proxies' credentials in Secrets Manager.

use crate::domain::proxy::ProxySecret;
use crate::ports::error::StoreError;
use crate::ports::secrets::Secrets;

/// [`Secrets`] in AWS Secrets Manager (`GetSecretValue`, a string secret).
#[derive(Debug, Clone)]
pub struct SecretsManager {
    client: aws_sdk_secretsmanager::Client,
}

impl SecretsManager {
    pub fn new(client: aws_sdk_secretsmanager::Client) -> Self {
        Self { client }
    }
}

impl Secrets for SecretsManager {
    async fn proxy_secret(&self, arn: &str) -> Result<ProxySecret, StoreError> {
        let out = self
            .client
            .get_secret_value()
            .secret_id(arn)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetSecretValue", e))?;
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
