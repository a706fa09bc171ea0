//! The Lambda entry point. It sets up logging, traces, configuration and clients once per
//! cold start, then runs the event loop.

use conveyor_worker::Config;
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::handler;
use conveyor_worker::metrics::MetricsSettings;
use conveyor_worker::wiring::aws::{self, AwsWorker};
use conveyor_worker::wiring::init_error::fail_init;
use conveyor_worker::wiring::traces::{self, Traces};
use lambda_runtime::layers::{OpenTelemetryFaasTrigger, OpenTelemetryLayer, TracingLayer};
use lambda_runtime::{Error, LambdaEvent, Runtime, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let config = Config::from_env();
    let traces = traces::init(config.as_ref().ok().map(|c| &c.tracing), &function_name());
    let config = match config {
        Ok(config) => config,
        Err(err) => return Err(fail_init("ConfigError", err).await),
    };
    let sdk = aws::SharedSdk::load(aws::Trust::CompiledIn);
    let secret = match aws::proxy_secret(&config, &sdk).await {
        Ok(secret) => secret,
        Err(err) => return Err(fail_init("ProxySecretError", err).await),
    };
    let worker = match AwsWorker::from_config(&config, &sdk, &secret) {
        Ok(worker) => worker,
        Err(err) => return Err(fail_init("BuildError", err).await),
    };
    let limits = BatchLimits::from(&config);
    let metrics = &MetricsSettings::from(&config);
    let (worker, sdk) = (&worker, &sdk);
    let handler = service_fn(move |event: LambdaEvent<_>| async move {
        sdk.ready().await;
        Ok::<_, Error>(handler::handle(worker, limits, metrics, event).await)
    });
    let runtime = Runtime::new(handler).layer(TracingLayer::new());
    let Some(traces) = traces else {
        return runtime.run().await;
    };
    // The spans are flushed once the reply is posted: SQS never waits for the collector.
    let flushed = traces.clone();
    let otel = OpenTelemetryLayer::new(move || flushed.flush())
        .with_trigger(OpenTelemetryFaasTrigger::PubSub);
    let ran = runtime.layer(otel).run().await;
    Traces::shutdown(&traces);
    ran
}

/// The function's name, as Lambda sets it, for the spans' `service.name`.
fn function_name() -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "conveyor-worker".into())
}
