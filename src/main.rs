//! The Lambda entry point. It sets up logging, configuration and clients once per cold start,
//! then runs the event loop.

use conveyor_worker::Config;
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::metrics::MetricsSettings;
use conveyor_worker::wiring::aws::{self, AwsWorker};
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(err) => return Err(aws::fail_init("ConfigError", err).await),
    };
    let sdk = aws::SharedSdk::load(aws::Trust::CompiledIn);
    let secret = match aws::proxy_secret(&config, &sdk).await {
        Ok(secret) => secret,
        Err(err) => return Err(aws::fail_init("ProxySecretError", err).await),
    };
    let worker = match AwsWorker::from_config(&config, &sdk, &secret) {
        Ok(worker) => worker,
        Err(err) => return Err(aws::fail_init("BuildError", err).await),
    };
    let limits = BatchLimits::from(&config);
    let metrics = &MetricsSettings::from(&config);
    let (worker, sdk) = (&worker, &sdk);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        sdk.ready().await;
        Ok::<_, Error>(aws::handle(worker, limits, metrics, event).await)
    }))
    .await
}
