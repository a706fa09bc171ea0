//! The proxies' credentials in Secrets Manager: read once per cold start, never logged.

use crate::domain::proxy::ProxySecret;
use crate::store::error::AwsError;

/// The secret `arn` names, as the proxies' credentials. Neither the secret nor its parse
/// error quotes a credential.
pub async fn proxy_secret(
    client: &aws_sdk_secretsmanager::Client,
    arn: &str,
) -> Result<ProxySecret, AwsError> {
    let out = client
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(|e| AwsError::from_sdk("GetSecretValue", e))?;
    let text = out.secret_string().ok_or_else(|| AwsError::Corrupt {
        what: "proxy secret",
        detail: "it holds no string (SecretBinary is not read)".into(),
    })?;
    ProxySecret::parse(text).map_err(|detail| AwsError::Corrupt {
        what: "proxy secret",
        detail,
    })
}
