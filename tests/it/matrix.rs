//! The matrix, tested as one system: configurations drawn from seeds (politeness, proxies,
//! a paid budget, data contract, queue kind, duplicate policy, an operator's step mid-run,
//! crashes, the production-like layer, AWS faults, the job's `render`, a site mix), each
//! run drained through
//! the local event source mapping and checked against every invariant
//! (`conveyor_testkit::matrix`). `MATRIX_SEEDS=1,2,3` runs those seeds, `MATRIX_RANDOM=N` N
//! random ones (`make chaos SEEDS=N`); a failing seed prints how to replay it.

use conveyor_testkit::logs::Captured;
use conveyor_testkit::matrix::{self, Draw};
use futures_util::FutureExt;

/// The seeds `make test` runs (about 130 s on 2 cores): small runs, between them a proxy tier
/// and a paid one with its budget, data contracts v1, v2 and v3, both policies and queue
/// kinds, both operator steps, crashes, the production-like layer, and `render: always`
/// (three, the renderer's Chromium behind the proxies and the paid tier) and `auto`.
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

/// A process's main thread's stack. A test thread has 2 MiB, and in a debug build the poll
/// frames of a whole system run in one `block_on` (the mapping's pollers, the sandboxes with
/// their proxy tiers and paid budget, their records) come near it: the seeds needed 2.5 MiB
/// when this was set.
const MAIN_STACK: usize = 8 << 20;

#[test]
fn every_drawn_configuration_keeps_every_invariant() {
    let seeds = std::thread::Builder::new()
        .stack_size(MAIN_STACK)
        .spawn(check_every_seed)
        .expect("a thread for the seeds");
    if let Err(panic) = seeds.join() {
        std::panic::resume_unwind(panic);
    }
}

fn check_every_seed() {
    conveyor_testkit::chaos::quiet_injected_crashes();
    let logs = Captured::default();
    let dispatch = capture(&logs);
    let each_thread = dispatch.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        // Every thread of the runtime logs to `logs`, whatever the rest of the binary set.
        .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&each_thread)))
        .build()
        .expect("a runtime");
    let _here = tracing::dispatcher::set_default(&dispatch);
    let failed = runtime.block_on(run_seeds(&logs));
    assert!(
        failed.is_empty(),
        "seeds that broke an invariant: {failed:?}"
    );
}

/// The worker's lines at debug (or as `RUST_LOG` says), kept in `logs`.
fn capture(logs: &Captured) -> tracing::Dispatch {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "conveyor_worker=debug".into());
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::Dispatch::new(subscriber)
}

/// Runs every seed, each checked against every invariant and its logs for secrets; the
/// seeds that broke one.
async fn run_seeds(logs: &Captured) -> Vec<u64> {
    let mut failed = Vec::new();
    for seed in seeds() {
        let draw = Draw::of(seed);
        println!("matrix {draw}");
        // A broken invariant panics (its message printed by the hook): the seed is reported,
        // the rest run.
        let run = std::panic::AssertUnwindSafe(matrix::run(&draw)).catch_unwind();
        let ran = run.await;
        let lines = logs.take();
        if std::env::var_os("RUST_LOG").is_some() {
            println!("{lines}");
        }
        let leaked = matrix::secrets_in(&lines);
        match ran {
            Ok(figures) if leaked.is_empty() => println!("matrix {}", figures.line(&draw)),
            _ => {
                if !leaked.is_empty() {
                    println!("matrix seed {seed}: a secret in the logs: {leaked:?}");
                }
                println!(
                    "matrix seed {seed} FAILED: {draw}\n  replay: MATRIX_SEEDS={seed} \
                     scripts/with-moto cargo test --locked --test it matrix:: -- --nocapture"
                );
                failed.push(seed);
            }
        }
    }
    failed
}

#[test]
fn the_secret_check_finds_a_proxy_password_plain_or_in_a_basic_header() {
    use conveyor_testkit::forward_proxy::{PASSWORD, USER};
    let header = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    };
    let logs = format!(
        "a line with nothing\nproxy http://{USER}:{PASSWORD}@127.0.0.1:3128\n\
         proxy-authorization: Basic {header}\nanother line"
    );

    let found = matrix::secrets_in(&logs);

    assert_eq!(found.len(), 2, "{found:?}");
}
