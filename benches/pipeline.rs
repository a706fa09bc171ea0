//! CPU per record: the whole pipeline (message parsing, guard, fetch, converge, the partial
//! batch reply) over in-process stores and pages, so only the worker's own work is timed.
//! `cargo bench --bench pipeline`; `make bench` reads its estimates into BENCHMARKS.md.
//! To profile it, keep the symbols the release profile strips (a separate build):
//! `CARGO_PROFILE_BENCH_STRIP=none cargo bench --bench pipeline -- --profile-time 5` under
//! `perf record`.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use conveyor_testkit::deliveries;
use conveyor_testkit::memory::{self, CPU_BATCHES, CPU_PAGE_BYTES, MemoryPages};
use conveyor_worker::batch::{BatchLimits, run_batch};
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

criterion_group!(benches, pipeline);
criterion_main!(benches);
