//! The matrix, tested as one system: configurations drawn from seeds (politeness, proxies,
//! a paid budget, data contract, queue kind, duplicate policy, an operator's step mid-run,
//! crashes, the production-like layer, AWS faults, a site mix), each run drained through
//! the local event source mapping and checked against every invariant
//! (`conveyor_testkit::matrix`). `MATRIX_SEEDS=1,2,3` runs those seeds, `MATRIX_RANDOM=N` N
//! random ones (`make chaos SEEDS=N`); a failing seed prints how to replay it.

use conveyor_testkit::matrix::{self, Draw};
use futures_util::FutureExt;

/// The seeds `make test` runs (about 70 s on 2 cores): small runs, between them a proxy tier
/// and a paid one with its budget, data contracts v1, v2 and v3, both policies and queue
/// kinds, both operator steps, crashes and the production-like layer.
const FIXED: &[u64] = &[1, 2, 3, 4];

/// The seeds to run: `MATRIX_SEEDS`, or `MATRIX_RANDOM` random ones, or [`FIXED`].
fn seeds() -> Vec<u64> {
    if let Ok(list) = std::env::var("MATRIX_SEEDS") {
        return list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("MATRIX_SEEDS: numbers, comma-separated")
            })
            .collect();
    }
    match std::env::var("MATRIX_RANDOM")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        Some(n) => (0..n).map(|_| fastrand::u64(..)).collect(),
        None => FIXED.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_drawn_configuration_keeps_every_invariant() {
    conveyor_testkit::chaos::quiet_injected_crashes();
    let mut failed = Vec::new();
    for seed in seeds() {
        let draw = Draw::of(seed);
        println!("matrix {draw}");
        // A broken invariant panics (its message printed by the hook): the seed is reported,
        // the rest run.
        let run = std::panic::AssertUnwindSafe(matrix::run(&draw)).catch_unwind();
        match run.await {
            Ok(figures) => println!("matrix {}", figures.line(&draw)),
            Err(_) => {
                println!(
                    "matrix seed {seed} FAILED: {draw}\n  replay: MATRIX_SEEDS={seed} \
                     scripts/with-moto cargo test --locked --test it matrix:: -- --nocapture"
                );
                failed.push(seed);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "seeds that broke an invariant: {failed:?}"
    );
}
