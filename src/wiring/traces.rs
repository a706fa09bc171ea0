//! Logging, and traces when they are on: the log lines as Lambda's default subscriber writes
//! them, plus an OpenTelemetry layer that exports the worker's spans by OTLP/HTTP, flushed
//! after each invocation's reply within a bound. Dropped spans are counted.

use std::env;
use std::str::FromStr;

use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_aws::trace::XrayIdGenerator;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SamplingResult, SdkTracerProvider,
    ShouldSample, SpanData, SpanExporter,
};
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, LevelFilter, filter_fn};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{Layer, Registry};

use crate::trace;
use crate::wiring::config::TraceSettings;

/// What exports the spans; flushed after each invocation, shut down at the end.
#[derive(Debug, Clone)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Sends the spans ended so far. Blocks at most the export timeout.
    pub fn flush(&self) {
        if let Err(err) = self.provider.force_flush() {
            tracing::debug!(error = %err, "spans not flushed");
        }
    }

    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }

    /// The layer that turns the worker's spans into OpenTelemetry spans for this exporter.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("conveyor-worker"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_filter(filter_fn(exported))
    }
}

/// A layer that writes log lines.
pub type LogLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs Lambda's log lines, with the trace exporter when `settings` turn it on.
/// `service` names the function in every span.
pub fn init(settings: Option<&TraceSettings>, service: &str) -> Option<Traces> {
    init_with(lambda_log_layer(), settings, service)
}

/// Installs `logs`, with the trace exporter when `settings` turn it on.
pub fn init_with(
    logs: LogLayer,
    settings: Option<&TraceSettings>,
    service: &str,
) -> Option<Traces> {
    let traces = settings.filter(|s| s.on).and_then(|s| exporter(s, service));
    let otel = traces.as_ref().map(Traces::layer);
    let result = tracing_subscriber::registry()
        .with(logs)
        .with(otel)
        .try_init();
    if result.is_ok() && traces.is_some() {
        trace::switch_on();
    }
    traces
}

/// Only spans are exported (never events, which may quote a page or a URL): the worker's
/// own, and the invocation's span from `lambda_runtime`.
fn exported(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    meta.is_span()
        && *meta.level() <= Level::INFO
        && (target.starts_with("conveyor_worker")
            || target.starts_with("lambda_runtime::layers::otel"))
}

/// Log lines as `lambda_runtime`'s default subscriber writes them: JSON when Lambda's log
/// format is JSON, at `AWS_LAMBDA_LOG_LEVEL` (or `RUST_LOG`), INFO by default.
fn lambda_log_layer() -> LogLayer {
    let json = env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let level = env::var("AWS_LAMBDA_LOG_LEVEL").or_else(|_| env::var("RUST_LOG"));
    let level = level.ok().and_then(|l| LevelFilter::from_str(&l).ok());
    let filter = EnvFilter::builder()
        .with_default_directive(level.unwrap_or(LevelFilter::INFO).into())
        .from_env_lossy();
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .without_time();
    match json {
        true => fmt.json().with_filter(filter).boxed(),
        false => fmt.with_filter(filter).boxed(),
    }
}

/// The OTLP/HTTP exporter behind a batch processor, X-Ray ids, and the task sampler.
pub fn exporter(settings: &TraceSettings, service: &str) -> Option<Traces> {
    let endpoint = format!("{}/v1/traces", settings.endpoint.trim_end_matches('/'));
    let otlp = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .with_timeout(settings.export_timeout)
        .build();
    let otlp = match otlp {
        Ok(otlp) => otlp,
        Err(err) => {
            eprintln!("tracing stays off: the OTLP exporter could not be built: {err}");
            return None;
        }
    };
    let batches = BatchConfigBuilder::default()
        .with_max_queue_size(8_192)
        .with_max_export_batch_size(1_024)
        .build();
    let processor = BatchSpanProcessor::builder(Counted(otlp))
        .with_batch_config(batches)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(TaskSampler::new(settings.sample_rate))
        .with_id_generator(XrayIdGenerator::default())
        .with_resource(
            Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .build();
    Some(Traces { provider })
}

/// An exporter that counts the spans of every batch it could not send.
#[derive(Debug)]
struct Counted<E>(E);

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let sent = self.0.export(batch).await;
        if sent.is_err() {
            trace::count_dropped(spans);
        }
        sent
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// The producer's decision, when its header made one (`Sampled=1` or `0`), holds for the
/// whole task. Otherwise (no header, or `Sampled=?`) a share of traces is kept, chosen by the
/// trace id, so every delivery of one task decides alike.
#[derive(Debug, Clone)]
struct TaskSampler {
    by_id: Sampler,
    by_parent: Sampler,
}

impl TaskSampler {
    fn new(rate: f64) -> Self {
        Self {
            by_id: Sampler::TraceIdRatioBased(rate),
            by_parent: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(rate))),
        }
    }
}

impl ShouldSample for TaskSampler {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let deferred = parent
            .map(|cx| cx.span().span_context().clone())
            .is_some_and(|sc| sc.is_remote() && trace::is_deferred(sc.trace_flags()));
        let sampler = if deferred {
            &self.by_id
        } else {
            &self.by_parent
        };
        sampler.should_sample(parent, trace_id, name, kind, attributes, links)
    }
}
