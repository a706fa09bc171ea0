//! CPU per record: the whole pipeline (message parsing, guard, fetch, converge, the partial
//! batch reply) over in-process stores and pages, so only the worker's own work is timed;
//! and the check of one page for block pages alone (`blocks/...`); and the batch of 10 as
//! deployed, with JSON log lines, tracing off (`deployed/logged`) and on
//! (`deployed/traced-1pct`, `deployed/traced`).
//! `cargo bench --bench pipeline`; `make bench` reads its estimates into BENCHMARKS.md.
//! To profile it, keep the symbols the release profile strips (a separate build):
//! `CARGO_PROFILE_BENCH_STRIP=none cargo bench --bench pipeline -- --profile-time 5` under
//! `perf record`.

use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use bytes::Bytes;
use conveyor_testkit::deliveries;
use conveyor_testkit::memory::{self, CPU_BATCHES, CPU_PAGE_BYTES, MemoryPages};
use conveyor_worker::batch::{BatchLimits, run_batch};
use conveyor_worker::domain::blocks::Detection;
use conveyor_worker::domain::shells::shell_of;
use conveyor_worker::trace;
use conveyor_worker::wiring::config::TraceSettings;
use conveyor_worker::wiring::traces;
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tracing::Dispatch;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

/// The worker's default MAX_CONCURRENCY.
const LIMITS: BatchLimits = BatchLimits {
    max_concurrency: 16,
    deadline_margin: Duration::from_millis(500),
};

/// Every page of 16 KiB, at once.
fn bench_pages() -> MemoryPages {
    MemoryPages {
        body: Bytes::from(vec![b'x'; CPU_PAGE_BYTES]),
        delay: Duration::ZERO,
    }
}

fn pipeline(c: &mut Criterion) {
    // The runtime the function runs on (`#[tokio::main]`: multi-threaded).
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let (pages, limits) = (bench_pages(), LIMITS);
    let mut group = c.benchmark_group("pipeline");
    for size in CPU_BATCHES {
        let batch = deliveries(size);
        group.throughput(Throughput::Elements(size as u64));
        group.sample_size(if size > 1_000 { 10 } else { 100 });
        group.bench_with_input(BenchmarkId::new("batch", size), &batch, |b, batch| {
            b.to_async(&runtime).iter_batched(
                || memory::worker(pages.clone(), size, "http://example.test/page"),
                |worker| async move {
                    let deadline = SystemTime::now() + Duration::from_secs(900);
                    let run = run_batch(&worker, batch, "bench", deadline, limits).await;
                    assert!(run.response.batch_item_failures.is_empty());
                    // Dropped outside the timing: its stores hold every page.
                    worker
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

/// The block page check of one 16 KiB page: the bench's page, and an HTML page whose title
/// comes after 2 KiB of its head.
fn blocks(c: &mut Criterion) {
    let detection = Detection::default();
    let pages = [
        ("bench-page", vec![b'x'; CPU_PAGE_BYTES]),
        ("html-page", html_page()),
    ];
    let mut group = c.benchmark_group("blocks");
    for (name, page) in &pages {
        group.bench_function(*name, |b| {
            b.iter(|| detection.by_body(Some("text/html"), std::hint::black_box(page)));
        });
    }
    group.finish();
}

/// The application shell check of the same pages, of that HTML page with a script and a
/// mount node (`<div id="app">` around its text: read until its text passes the bound), and
/// of a shell.
fn shells(c: &mut Criterion) {
    let mounted = String::from_utf8(html_page()).expect("ASCII").replacen(
        "<body>",
        "<script src=\"/app.js\"></script><body><div id=\"app\">",
        1,
    );
    let shell = br#"<!doctype html><html><head><title>Shop</title></head><body><div id="root"></div><script src="/static/js/main.js"></script></body></html>"#;
    let pages = [
        ("bench-page", vec![b'x'; CPU_PAGE_BYTES]),
        ("html-page", html_page()),
        ("html-page-mounted", mounted.into_bytes()),
        ("shell", shell.to_vec()),
    ];
    let mut group = c.benchmark_group("shells");
    for (name, page) in &pages {
        group.bench_function(*name, |b| {
            b.iter(|| shell_of(Some("text/html"), std::hint::black_box(page)));
        });
    }
    group.finish();
}

/// A 16 KiB HTML page whose title comes after 2 KiB of its head.
fn html_page() -> Vec<u8> {
    let mut html = b"<!DOCTYPE html><html><head>".to_vec();
    html.extend(b"<meta name=\"x\" content=\"y\">".repeat(2048 / 32));
    html.extend_from_slice(b"<title>Blue kettle | shop.example</title></head><body>");
    while html.len() < CPU_PAGE_BYTES {
        html.extend_from_slice(
            b"<p>Boils a full kettle in under four minutes, <a href=\"/k\">more</a>.</p>",
        );
    }
    html
}

/// The batch of 10 under the subscriber a deployed function has: JSON log lines at INFO (to
/// nowhere here), with tracing off, and on with 1% and with every task sampled (the spans
/// sent to an OTLP endpoint where nothing listens).
fn deployed(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let (pages, limits) = (bench_pages(), LIMITS);
    let logs = || {
        let json = tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::sink);
        json.with_filter(LevelFilter::INFO)
    };
    let settings = TraceSettings {
        on: true,
        sample_rate: 1.0,
        endpoint: "http://127.0.0.1:9".into(),
        export_timeout: Duration::from_millis(200),
    };
    let exporter = traces::exporter(&settings, "bench").expect("an exporter");
    let logged = Dispatch::new(tracing_subscriber::registry().with(logs()));
    let traced = Dispatch::new(
        tracing_subscriber::registry()
            .with(logs())
            .with(exporter.layer()),
    );
    let (size, batch) = (10, deliveries(10));
    let mut group = c.benchmark_group("deployed");
    group.throughput(Throughput::Elements(size as u64));
    let variants = [
        ("logged", logged, None),
        ("traced-1pct", traced.clone(), Some(0.01)),
        ("traced", traced, Some(1.0)),
    ];
    for (name, dispatch, share) in variants {
        match share {
            Some(share) => trace::switch_on(share),
            None => trace::switch_off(),
        }
        group.bench_with_input(BenchmarkId::new(name, size), &batch, |b, batch| {
            b.to_async(&runtime).iter_batched(
                // New message ids each time: each is a trace of its own, sampled or not.
                || {
                    (
                        memory::worker(pages.clone(), size, "http://example.test/page"),
                        fresh(batch),
                    )
                },
                |(worker, batch)| {
                    async move {
                        let deadline = SystemTime::now() + Duration::from_secs(900);
                        let run = run_batch(&worker, &batch, "bench", deadline, limits).await;
                        assert!(run.response.batch_item_failures.is_empty());
                        (worker, batch)
                    }
                    .with_subscriber(dispatch.clone())
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

/// `batch` with new message ids.
fn fresh(batch: &[SqsMessage]) -> Vec<SqsMessage> {
    let renamed = batch.iter().cloned().map(|mut record| {
        record.message_id = Some(format!("m-{:032x}", fastrand::u128(..)));
        record
    });
    renamed.collect()
}

criterion_group!(benches, pipeline, blocks, shells, deployed);
criterion_main!(benches);
