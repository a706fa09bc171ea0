//! Logging, and traces when they are on: the log lines as Lambda's default subscriber writes
//! them, plus an OpenTelemetry layer that exports the worker's spans by OTLP/HTTP, flushed
//! after each invocation's reply within a bound. Dropped spans are counted.

use std::env;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_aws::trace::XrayIdGenerator;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, LevelFilter, filter_fn};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{Layer, Registry};

use crate::trace;
use crate::wiring::config::TraceSettings;
use crate::wiring::span_buffer::SpanBuffer;

/// Time for a timed-out export to give up and be counted, past the export timeout.
pub const GIVING_UP: Duration = Duration::from_millis(100);

/// What exports the spans; flushed after each invocation, shut down at the end.
#[derive(Debug, Clone)]
pub struct Traces {
    provider: SdkTracerProvider,
    /// The longest a flush holds its caller: the export timeout, and a little for the
    /// exporter to give up and count what it dropped.
    bound: Duration,
}

impl Traces {
    /// Sends the spans ended so far, holding the caller at most the export timeout (and
    /// [`GIVING_UP`]). The flush sends every buffered span, a batch at a time, so it runs on a
    /// thread of its own, which may go on after the caller has.
    pub fn flush(&self) {
        let (done, flushed) = std::sync::mpsc::channel();
        let provider = self.provider.clone();
        let flushing = std::thread::Builder::new()
            .name("trace-flush".into())
            .spawn(move || drop(done.send(provider.force_flush())));
        if flushing.is_err() {
            return;
        }
        match flushed.recv_timeout(self.bound) {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::debug!(error = %err, "spans not flushed"),
            Err(_) => tracing::debug!("spans still flushing after the export timeout"),
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
    if let (Ok(()), Some(settings)) = (result, settings.filter(|_| traces.is_some())) {
        trace::switch_on(settings.sample_rate);
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
            || target == trace::STEP
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
    let filter = without_steps(filter);
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .without_time();
    match json {
        true => fmt.json().with_filter(filter).boxed(),
        false => fmt.with_filter(filter).boxed(),
    }
}

/// `filter` leaving out the spans made for traces alone (`trace::STEP`).
pub fn without_steps(filter: EnvFilter) -> EnvFilter {
    // Cannot fail: a target and a level.
    filter.add_directive(format!("{}=off", trace::STEP).parse().expect("a directive"))
}

/// The OTLP/HTTP exporter behind the span buffer ([`SpanBuffer`]), with X-Ray ids.
pub fn exporter(settings: &TraceSettings, service: &str) -> Option<Traces> {
    let endpoint = format!("{}/v1/traces", settings.endpoint.trim_end_matches('/'));
    let client = LazyClient {
        timeout: settings.export_timeout,
        client: OnceLock::new(),
    };
    let otlp = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
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
    let provider = SdkTracerProvider::builder()
        .with_span_processor(SpanBuffer::new(otlp, trace::count_dropped))
        // A delivery's decision is made with its parent (`trace::continue_delivery`); a
        // span without one (the invocation's) keeps the same share.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample_rate,
        ))))
        .with_id_generator(XrayIdGenerator::default())
        .with_resource(
            Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .build();
    Some(Traces {
        provider,
        bound: settings.export_timeout + GIVING_UP,
    })
}

/// The exporter's HTTP client, built at its first export on the exporter's own thread, so
/// not during the cold start (docs/performance.md). It trusts Mozilla's roots as compiled
/// in, as the fetcher does.
#[derive(Debug)]
struct LazyClient {
    timeout: Duration,
    client: OnceLock<reqwest::blocking::Client>,
}

#[async_trait::async_trait]
impl HttpClient for LazyClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = match self.client.get() {
            Some(client) => client,
            None => {
                let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter();
                let roots = roots.filter_map(|der| reqwest::Certificate::from_der(der).ok());
                let built = reqwest::blocking::Client::builder()
                    .timeout(self.timeout)
                    .tls_certs_only(roots)
                    .build()?;
                self.client.get_or_init(|| built)
            }
        };
        client.send_bytes(request).await
    }
}
