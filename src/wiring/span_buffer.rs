//! The span processor for traces on Lambda: an invocation's spans are buffered in memory and
//! sent when the invocation's reply has been posted (the flush), or sooner, 512 at a time,
//! when many end. Nothing is built or allocated before the first span ends, so tracing adds almost
//! nothing to the cold start (the SDK's batch processor builds its whole queue and a thread
//! there: docs/performance.md).

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

/// The most spans sent in one export.
pub const BATCH: usize = 512;
/// The most spans buffered while one export is on its way: more are dropped and counted.
pub const MOST_BUFFERED: usize = 2_048;

/// Buffers ended spans and sends them through `E`, from a thread of its own, never from the
/// thread that ended them.
#[derive(Debug)]
pub struct SpanBuffer<E> {
    exporter: Arc<E>,
    buffered: Mutex<Vec<SpanData>>,
    /// The export started before the flush, while spans kept ending.
    sending: Mutex<Option<JoinHandle<()>>>,
    /// Counts the spans dropped: over [`MOST_BUFFERED`], or in an export that failed.
    dropped: fn(u64),
}

impl<E: SpanExporter + 'static> SpanBuffer<E> {
    pub fn new(exporter: E, dropped: fn(u64)) -> Self {
        Self {
            exporter: Arc::new(exporter),
            buffered: Mutex::new(Vec::new()),
            sending: Mutex::new(None),
            dropped,
        }
    }

    /// Sends a full batch on a thread of its own, unless one is still on its way.
    fn send_early(&self, buffered: &mut Vec<SpanData>) {
        let mut sending = lock(&self.sending);
        if sending.as_ref().is_some_and(|thread| !thread.is_finished()) {
            return;
        }
        let batch = std::mem::take(buffered);
        let (exporter, dropped) = (Arc::clone(&self.exporter), self.dropped);
        let thread = std::thread::Builder::new()
            .name("trace-export".into())
            .spawn(move || drop(export(&*exporter, batch, dropped)));
        // A thread that could not start leaves the spans to the flush's cap.
        *sending = thread.ok();
    }

    /// Waits for the early export, then sends what is buffered, a batch at a time.
    fn send_all(&self) -> OTelSdkResult {
        // Taken out first: the lock is not held while the thread finishes, so spans that
        // end meanwhile are buffered without waiting for it.
        let early = lock(&self.sending).take();
        if let Some(thread) = early {
            let _ = thread.join();
        }
        let buffered = std::mem::take(&mut *lock(&self.buffered));
        let mut sent = Ok(());
        for batch in buffered.chunks(BATCH) {
            sent = sent.and(export(&*self.exporter, batch.to_vec(), self.dropped));
        }
        sent
    }
}

impl<E: SpanExporter + 'static> SpanProcessor for SpanBuffer<E> {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let mut buffered = lock(&self.buffered);
        if buffered.len() >= MOST_BUFFERED {
            (self.dropped)(1);
            return;
        }
        buffered.push(span);
        if buffered.len() >= BATCH {
            self.send_early(&mut buffered);
        }
    }

    /// Called on the flush's own thread ([`super::traces::Traces::flush`]).
    fn force_flush(&self) -> OTelSdkResult {
        self.send_all()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        // The shutdown runs inside the runtime, where the exporter's blocking HTTP client
        // may not run: the last spans go from a thread of their own.
        std::thread::scope(|scope| {
            let sent = scope.spawn(|| self.send_all()).join();
            sent.unwrap_or(Ok(()))
        })?;
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // The provider sets the resource once, when it is built: before any span ended, so
        // nothing shares the exporter yet.
        if let Some(exporter) = Arc::get_mut(&mut self.exporter) {
            exporter.set_resource(resource);
        }
    }
}

/// Sends one batch, counting its spans as dropped if it could not go.
fn export<E: SpanExporter>(exporter: &E, batch: Vec<SpanData>, dropped: fn(u64)) -> OTelSdkResult {
    let spans = batch.len() as u64;
    let sent = futures_executor::block_on(exporter.export(batch));
    if sent.is_err() {
        dropped(spans);
    }
    sent
}

/// A lock that a panicked holder left is still the spans' list.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Tracer, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

    /// An exporter that records each batch's size, and can keep an export waiting until released.
    #[derive(Debug, Default)]
    struct Recorder {
        batches: Mutex<Vec<usize>>,
        gate: Option<Mutex<Receiver<()>>>,
        fails: bool,
    }

    impl SpanExporter for Recorder {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if let Some(gate) = &self.gate {
                let _ = lock(gate).recv();
            }
            lock(&self.batches).push(batch.len());
            match self.fails {
                true => Err(OTelSdkError::InternalFailure("collector down".into())),
                false => Ok(()),
            }
        }
    }

    fn provider(exporter: Recorder, dropped: fn(u64)) -> (SdkTracerProvider, Arc<Recorder>) {
        let buffer = SpanBuffer::new(exporter, dropped);
        let seen = Arc::clone(&buffer.exporter);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(buffer)
            .build();
        (provider, seen)
    }

    fn end_spans(provider: &SdkTracerProvider, count: usize) {
        let tracer = provider.tracer("test");
        for _ in 0..count {
            drop(tracer.start("span"));
        }
    }

    /// An exporter whose exports wait for `release`, and the sender that releases them.
    fn gated() -> (Recorder, SyncSender<()>) {
        let (release, gate) = sync_channel(16);
        let exporter = Recorder {
            gate: Some(Mutex::new(gate)),
            ..Recorder::default()
        };
        (exporter, release)
    }

    #[test]
    fn spans_are_buffered_until_the_flush_then_sent_together() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let (provider, seen) = provider(Recorder::default(), |n| {
            DROPPED.fetch_add(n, Ordering::Relaxed);
        });

        end_spans(&provider, 100);
        let before_flush = lock(&seen.batches).clone();
        provider.force_flush().unwrap();

        assert_eq!(before_flush, Vec::<usize>::new());
        assert_eq!(*lock(&seen.batches), vec![100]);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_batch_is_sent_early_and_the_flush_waits_for_it() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let (exporter, release) = gated();
        let (provider, seen) = provider(exporter, |n| {
            DROPPED.fetch_add(n, Ordering::Relaxed);
        });

        end_spans(&provider, 1_300);
        for _ in 0..3 {
            release.send(()).unwrap();
        }
        provider.force_flush().unwrap();

        assert_eq!(*lock(&seen.batches), vec![512, 512, 276]);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn spans_past_the_most_buffered_are_dropped_and_counted() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let (exporter, release) = gated();
        let (provider, seen) = provider(exporter, |n| {
            DROPPED.fetch_add(n, Ordering::Relaxed);
        });

        // The first 512 are on their way (stuck); 2,048 more are buffered; 100 find no room.
        end_spans(&provider, BATCH + MOST_BUFFERED + 100);
        for _ in 0..5 {
            release.send(()).unwrap();
        }
        provider.force_flush().unwrap();

        assert_eq!(*lock(&seen.batches), vec![512, 512, 512, 512, 512]);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn a_failed_export_counts_its_spans_and_the_shutdown_sends_what_is_left() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let failing = Recorder {
            fails: true,
            ..Recorder::default()
        };
        let (provider, seen) = provider(failing, |n| {
            DROPPED.fetch_add(n, Ordering::Relaxed);
        });

        end_spans(&provider, 30);
        let shut = provider.shutdown();

        assert!(shut.is_err());
        assert_eq!(*lock(&seen.batches), vec![30]);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 30);
    }
}
