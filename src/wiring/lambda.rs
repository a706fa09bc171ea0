//! The Lambda event loop both functions run, the worker and the renderer: records through
//! the handler, traces flushed once the reply is posted. `main.rs` of each builds its worker
//! and hands it here.

use lambda_runtime::layers::{OpenTelemetryFaasTrigger, OpenTelemetryLayer, TracingLayer};
use lambda_runtime::{Error, LambdaEvent, Runtime, service_fn};

use crate::batch::{BatchLimits, ProcessRecord};
use crate::handler;
use crate::metrics::MetricsSettings;
use crate::wiring::aws::SharedSdk;
use crate::wiring::config::Config;
use crate::wiring::traces::Traces;

/// Runs the event loop until the runtime stops it.
pub async fn serve<P: ProcessRecord>(
    processor: &P,
    config: &Config,
    sdk: &SharedSdk,
    traces: Option<Traces>,
) -> Result<(), Error> {
    let limits = BatchLimits::from(config);
    let metrics = &MetricsSettings::from(config);
    let handler = service_fn(move |event: LambdaEvent<_>| async move {
        sdk.ready().await;
        Ok::<_, Error>(handler::handle(processor, limits, metrics, event).await)
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

/// The function's name, as Lambda sets it, for the spans' `service.name`; `default` off
/// Lambda.
pub fn function_name(default: &str) -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| default.into())
}
