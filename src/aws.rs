//! AWS wiring: SDK configuration, clients and the production worker, built once per cold start.

use std::time::SystemTime;

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::LambdaEvent;

use crate::batch::{self, BatchLimits, Invocation, ProcessRecord};
use crate::config::Config;
use crate::contract::Outcome;
use crate::metrics::{self, MetricsSettings};
use crate::result_store::{ResultStore, S3ResultStore};
use crate::scraper::{FetchSettings, Fetcher, HttpFetcher};
use crate::task_store::{DynamoTaskStore, TaskStore};
use crate::visibility::{SqsVisibility, Visibility};
use crate::worker::Worker;

/// The worker as deployed: DynamoDB, S3 and reqwest.
pub type AwsWorker = Worker<DynamoTaskStore, S3ResultStore, HttpFetcher, SqsVisibility>;

/// Loads region, credentials and endpoint the standard way (`AWS_ENDPOINT_URL` included),
/// with the standard retry mode: our own AWS errors are retried within the invocation
/// before the record is reported for redelivery.
pub async fn sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .load()
        .await
}

/// S3 settings from the shared config; path-style addressing when the endpoint is overridden
/// (local emulators do not serve bucket subdomains).
pub fn s3_config(sdk: &SdkConfig) -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::config::Builder::from(sdk).force_path_style(sdk.endpoint_url().is_some())
}

/// Why the worker could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the HTTP client: {0}")]
pub struct BuildError(#[from] reqwest::Error);

impl AwsWorker {
    /// Builds every client once, from the configuration and the SDK config.
    pub fn from_config(config: &Config, sdk: &SdkConfig) -> Result<Self, BuildError> {
        if config.allow_private_networks {
            tracing::warn!(
                "ALLOW_PRIVATE_NETWORKS=true: pages on private and loopback addresses will be fetched"
            );
        }
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let s3 = aws_sdk_s3::Client::from_conf(s3_config(sdk).build());
        let sqs = aws_sdk_sqs::Client::new(sdk);
        Ok(Worker {
            tasks: DynamoTaskStore::new(dynamodb, &config.table_name),
            results: S3ResultStore::new(s3, &config.results_bucket),
            fetcher: HttpFetcher::new(&FetchSettings::from(config))?,
            visibility: SqsVisibility::new(sqs, sdk.endpoint_url().map(str::to_owned)),
            settings: config.into(),
        })
    }
}

impl<T: TaskStore, R: ResultStore, F: Fetcher, V: Visibility> ProcessRecord for Worker<T, R, F, V> {
    async fn process(&self, record: &SqsMessage, invocation: &Invocation) -> Outcome {
        Worker::process(self, record, invocation).await
    }
}

/// The Lambda handler: one SQS batch in, the partial batch response out, and the
/// invocation's metrics (EMF) on stdout.
pub async fn handle<P: ProcessRecord>(
    processor: &P,
    limits: BatchLimits,
    metrics: &MetricsSettings,
    event: LambdaEvent<SqsEvent>,
) -> SqsBatchResponse {
    let deadline = event.context.deadline();
    let request_id = &event.context.request_id;
    let records = &event.payload.records;
    let run = batch::run_batch(processor, records, request_id, deadline, limits).await;
    let documents = run.tally.documents(metrics, request_id, SystemTime::now());
    if let Err(err) = metrics::emit(&mut std::io::stdout().lock(), &documents) {
        tracing::warn!(error = %err, "could not write the invocation's metrics");
    }
    run.response
}
