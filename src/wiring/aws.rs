//! AWS wiring: SDK configuration, clients and the production worker, built once per cold start.

use std::sync::Arc;

use aws_config::environment::EnvironmentVariableCredentialsProvider;
use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

use crate::domain::proxy::ProxySecret;
use crate::ports::error::StoreError;
use crate::ports::secrets::Secrets;
use crate::scraper::{FetchSettings, HttpFetcher};
use crate::store::dynamo::DynamoTaskStore;
use crate::store::lazy::Lazy;
use crate::store::s3::S3ResultStore;
use crate::store::secrets::SecretsManager;
use crate::store::sqs::SqsVisibility;
use crate::wiring::config::Config;
use crate::worker::Worker;

/// The worker as deployed: DynamoDB, S3 and reqwest.
pub type AwsWorker = Worker<DynamoTaskStore, S3ResultStore, HttpFetcher, SqsVisibility>;

/// Which root certificates the SDK's HTTPS client trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// Mozilla's roots, compiled in ([`https_client`]). For the function, where cold starts
    /// count.
    CompiledIn,
    /// The system's store (the SDK's default client). For the operator's tool, which may run
    /// behind a proxy that re-signs TLS with a CA of its own.
    System,
}

/// Loads region, credentials and endpoint the standard way (`AWS_ENDPOINT_URL` included),
/// with the standard retry mode. So our own AWS errors are retried within the invocation
/// before the record is reported for redelivery.
pub async fn sdk_config(trust: Trust) -> SdkConfig {
    let loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(3));
    let loader = match trust {
        Trust::CompiledIn => loader.http_client(https_client()),
        Trust::System => loader,
    };
    let loader = if keys_in_environment() {
        // What the default credentials chain would pick first, without building the rest of
        // the chain at every cold start: an STS client for web identity, and the ECS and IMDS
        // providers.
        loader.credentials_provider(EnvironmentVariableCredentialsProvider::new())
    } else {
        loader
    };
    loader.load().await
}

/// The SDK's settings, loaded once per sandbox when the first batch arrives. The handler
/// waits for them in [`SharedSdk::ready`]. So a cold start asks Lambda for its first event
/// without waiting for them. docs/performance.md explains why they are not loaded earlier.
#[derive(Debug, Clone)]
pub struct SharedSdk {
    loaded: Arc<tokio::sync::OnceCell<SdkConfig>>,
    trust: Trust,
}

impl SharedSdk {
    /// Settings to load at their first use (as [`sdk_config`] loads them).
    pub fn load(trust: Trust) -> Self {
        Self {
            loaded: Arc::default(),
            trust,
        }
    }

    /// Settings already loaded (the operator's tool).
    pub fn loaded(config: SdkConfig) -> Self {
        Self {
            loaded: Arc::new(tokio::sync::OnceCell::new_with(Some(config))),
            trust: Trust::System,
        }
    }

    /// The settings, once loaded.
    pub async fn ready(&self) -> &SdkConfig {
        self.loaded.get_or_init(|| sdk_config(self.trust)).await
    }

    /// The settings, from a client built at its first use, within a record.
    fn get(&self) -> &SdkConfig {
        // The handler awaits `ready` before any record, and clients are built only in
        // records, so the cell is always set here.
        self.loaded
            .get()
            .expect("the SDK settings are loaded before the first record")
    }
}

/// The proxies' credentials, from `PROXY_SECRET_ARN` (none without it).
pub async fn proxy_secret(config: &Config, sdk: &SharedSdk) -> Result<ProxySecret, StoreError> {
    let Some(arn) = config.proxy_secret_arn.as_deref() else {
        return Ok(ProxySecret::default());
    };
    if config.proxies.is_empty() {
        tracing::warn!("PROXY_SECRET_ARN is set but PROXY_URLS is not: fetches go direct");
    }
    let sdk = sdk.ready().await;
    let secrets = SecretsManager::new(aws_sdk_secretsmanager::Client::new(sdk));
    secrets.proxy_secret(arn).await
}

/// Whether the environment holds credentials, as Lambda's always does (the function role's).
fn keys_in_environment() -> bool {
    let set = |name| std::env::var_os(name).is_some_and(|value| !value.is_empty());
    set("AWS_ACCESS_KEY_ID") && set("AWS_SECRET_ACCESS_KEY")
}

/// The SDK's HTTPS client, shared by every AWS client built from one config. It is rustls,
/// trusting Mozilla's roots compiled into the binary, as the fetcher does. The SDK's default
/// client reads the system's certificate store at every cold start: a directory of about
/// 300 files on Debian. AWS endpoints chain to Amazon Trust Services roots, which are in
/// Mozilla's set.
pub fn https_client() -> SharedHttpClient {
    let roots = TrustStore::empty().with_pem_certificate(MOZILLA_ROOTS);
    // `build` cannot fail: it only moves the trust store into the context.
    let context = TlsContext::builder().with_trust_store(roots).build();
    let client = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
        .tls_context(context.expect("a TLS context from a trust store"))
        .build_https();
    SharedHttpClient::new(ConnectOnFirstUse(client))
}

/// `webpki_root_certs::TLS_SERVER_ROOT_CERTS` as PEM, written by build.rs.
const MOZILLA_ROOTS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mozilla-roots.pem"));

/// The SDK's HTTP client, without its eager check. At construction, each SDK client (STS in
/// the credentials chain, DynamoDB, S3, SQS) has it build a connector, with its TLS
/// configuration and root store, only to drop it. Here the first request builds it, once.
/// The inner client caches connectors by their settings, and every client of the process
/// shares it.
#[derive(Debug)]
struct ConnectOnFirstUse(SharedHttpClient);

impl HttpClient for ConnectOnFirstUse {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// S3 settings from the shared config. Path-style addressing is used when the endpoint is
/// overridden, since local emulators do not serve bucket subdomains.
pub fn s3_config(sdk: &SdkConfig) -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::config::Builder::from(sdk).force_path_style(sdk.endpoint_url().is_some())
}

/// Why the worker could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the HTTP client: {0}")]
pub struct BuildError(#[from] reqwest::Error);

impl AwsWorker {
    /// Every client, from the configuration and the SDK config, each built at its first use.
    pub fn from_config(
        config: &Config,
        sdk: &SharedSdk,
        secret: &ProxySecret,
    ) -> Result<Self, BuildError> {
        let fetcher = HttpFetcher::new(&FetchSettings::from(config), secret)?;
        Ok(Worker::on_aws(config, sdk, fetcher))
    }
}

impl<F> Worker<DynamoTaskStore, S3ResultStore, F, SqsVisibility> {
    /// The worker on DynamoDB, S3 and SQS, fetching with `fetcher` (the renderer's browser
    /// is one). Each client is built at its first use: none before the first `next`
    /// request, and the SQS client only once a record is held back.
    pub fn on_aws(config: &Config, sdk: &SharedSdk, fetcher: F) -> Self {
        if config.allow_private_networks {
            tracing::warn!(
                "ALLOW_PRIVATE_NETWORKS=true: pages on private and loopback addresses will be fetched"
            );
        }
        let (d, s, q, e) = (sdk.clone(), sdk.clone(), sdk.clone(), sdk.clone());
        let dynamodb = Lazy::new(move || aws_sdk_dynamodb::Client::new(d.get()));
        let s3 = Lazy::new(move || aws_sdk_s3::Client::from_conf(s3_config(s.get()).build()));
        let sqs = Lazy::new(move || aws_sdk_sqs::Client::new(q.get()));
        let endpoint = Lazy::new(move || e.get().endpoint_url().map(str::to_owned));
        Worker::new(
            DynamoTaskStore::new(dynamodb, &config.table_name),
            S3ResultStore::new(s3, &config.results_bucket),
            fetcher,
            SqsVisibility::new(sqs, endpoint),
            config.into(),
        )
    }
}
