//! CPU per record: the whole pipeline (message parsing, guard, fetch, converge, the partial
//! batch reply) over in-process stores and pages, so only the worker's own work is timed;
//! and the check of one page for block pages alone (`blocks/...`).
//! `cargo bench --bench pipeline`; `make bench` reads its estimates into BENCHMARKS.md.
//! To profile it, keep the symbols the release profile strips (a separate build):
//! `CARGO_PROFILE_BENCH_STRIP=none cargo bench --bench pipeline -- --profile-time 5` under
//! `perf record`.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use conveyor_testkit::deliveries;
use conveyor_testkit::memory::{self, CPU_BATCHES, CPU_PAGE_BYTES, MemoryPages};
use conveyor_worker::batch::{BatchLimits, run_batch};
use conveyor_worker::domain::blocks::Detection;
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// The worker's default MAX_CONCURRENCY.
const CONCURRENCY: usize = 16;

fn pipeline(c: &mut Criterion) {
    // The runtime the function runs on (`#[tokio::main]`: multi-threaded).
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let pages = MemoryPages {
        body: Bytes::from(vec![b'x'; CPU_PAGE_BYTES]),
        delay: Duration::ZERO,
    };
    let limits = BatchLimits {
        max_concurrency: CONCURRENCY,
        deadline_margin: Duration::from_millis(500),
    };
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
    let mut html = b"<!DOCTYPE html><html><head>".to_vec();
    html.extend(b"<meta name=\"x\" content=\"y\">".repeat(2048 / 32));
    html.extend_from_slice(b"<title>Blue kettle | shop.example</title></head><body>");
    while html.len() < CPU_PAGE_BYTES {
        html.extend_from_slice(
            b"<p>Boils a full kettle in under four minutes, <a href=\"/k\">more</a>.</p>",
        );
    }
    let pages = [
        ("bench-page", vec![b'x'; CPU_PAGE_BYTES]),
        ("html-page", html),
    ];
    let mut group = c.benchmark_group("blocks");
    for (name, page) in &pages {
        group.bench_function(*name, |b| {
            b.iter(|| detection.by_body(Some("text/html"), std::hint::black_box(page)));
        });
    }
    group.finish();
}

criterion_group!(benches, pipeline, blocks);
criterion_main!(benches);
