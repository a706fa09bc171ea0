//! The Lambda entry point: logs, configuration and clients once per cold start, then the loop.

use conveyor_worker::Config;
use conveyor_worker::aws::{self, AwsWorker};
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::metrics::MetricsSettings;
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Config::from_env().inspect_err(|e| tracing::error!("cold start failed: {e}"))?;
    let worker = AwsWorker::from_config(&config, &aws::sdk_config(aws::Trust::CompiledIn).await)?;
    let limits = BatchLimits::from(&config);
    let metrics = &MetricsSettings::from(&config);
    let worker = &worker;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, Error>(aws::handle(worker, limits, metrics, event).await)
    }))
    .await
}
