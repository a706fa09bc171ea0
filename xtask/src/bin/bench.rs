//! `make bench`: how close the worker comes to its floors on this machine. Every figure is
//! the median of several runs, beside its floor measured in the same run (absolute times on
//! a shared machine drift; ratios hold). Writes BENCHMARKS.md and docs/concurrency.svg.
//!
//! Run by `make bench` against the local emulator; `bench --rss <n> <url>` is the child
//! process of the memory figure, and `bench --memory` prints the memory figures alone.

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use conveyor_testkit::memory;
use conveyor_testkit::otlp::{Mode, Receiver};
use conveyor_testkit::{Site, Stack, deliveries};
use conveyor_worker::batch::{BatchLimits, run_batch};
use conveyor_worker::scraper::{AddressPolicy, FetchSettings, HttpFetcher, SystemLookup};
use conveyor_worker::trace;
use conveyor_worker::wiring::config::TraceSettings;
use conveyor_worker::wiring::traces;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::process::Command;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::prelude::*;
use xtask::simulation;

/// The workspace's root (this crate is `xtask/` in it).
fn workspace() -> std::path::PathBuf {
    let xtask = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

const PAGE_MS: u64 = 100;
const PAGE_CONCURRENCY: usize = 32;

/// How big each figure's run is: the full report, or the quick pass `make test` runs (small
/// sizes; the same code paths and assertions, so a change that breaks a benchmark fails CI).
#[derive(Debug, Clone, Copy)]
struct Scale {
    /// Runs per figure; the median is reported.
    runs: usize,
    /// Tasks of the waiting-on-pages batch.
    page_tasks: usize,
    sweep: &'static [usize],
    /// Terminal tasks of the guard path.
    guarded: usize,
    /// Batches of 1 MB pages whose peak RSS is measured.
    pages: [usize; 2],
    /// Pages of 9.5 MB near the cap.
    cap_pages: usize,
    quick: bool,
}

const FULL: Scale = Scale {
    runs: 5,
    page_tasks: 200,
    sweep: &[4, 8, 16, 32, 64, 128],
    guarded: 1000,
    pages: [64, 512],
    cap_pages: 32,
    quick: false,
};

const QUICK: Scale = Scale {
    runs: 1,
    page_tasks: 32,
    sweep: &[8, 32],
    guarded: 50,
    pages: [8, 16],
    cap_pages: 2,
    quick: true,
};
const MEGABYTE: usize = 1024 * 1024;
/// MAX_BODY_BYTES, as deployed by default.
const CAP_BYTES: u64 = 10 * MEGABYTE as u64;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One line of the results table.
struct Figure {
    what: String,
    value: String,
    floor: String,
    ratio: Option<f64>,
    target: String,
    met: Option<bool>,
}

impl Figure {
    fn row(&self) -> String {
        let ratio = self.ratio.map_or("".into(), |r| format!("{r:.2}x"));
        let met = match self.met {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "",
        };
        format!(
            "| {} | {} | {} | {ratio} | {} | {met} |",
            self.what, self.value, self.floor, self.target
        )
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, n, url] = args.as_slice()
        && flag == "--rss"
    {
        return rss_probe(n.parse()?, url).await;
    }
    let site = Site::start().await;
    let flag = args.get(1).map(String::as_str);
    if flag == Some("--memory") {
        for figure in memory(&site, FULL).await? {
            println!("{}", figure.row());
        }
        return Ok(());
    }
    let scale = if flag == Some("--quick") { QUICK } else { FULL };
    let (figures, sweep) = figures(&site, scale).await?;
    if scale.quick {
        for figure in &figures {
            println!("{}", figure.row());
        }
        println!("quick pass: every figure ran and every batch ended as it measures");
        return Ok(());
    }

    let chart = concurrency_chart(&sweep);
    std::fs::write("docs/concurrency.svg", chart)?;
    // The simulation's section (`simulate`) is kept as it was.
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    let report = match simulation::report::section(&old) {
        Some(kept) => simulation::report::splice(&report(&figures, &sweep), &format!("{kept}\n")),
        None => report(&figures, &sweep),
    };
    // The renderer's section (`render-bench`) is kept as it was too.
    let (begin, end) = xtask::RENDER_SECTION;
    let report = match xtask::section(&old, begin, end) {
        Some(kept) => xtask::splice(&report, begin, end, &format!("{kept}\n")),
        None => report,
    };
    std::fs::write("BENCHMARKS.md", &report)?;
    println!("{report}");
    Ok(())
}

/// Every figure at `scale`, and the concurrency sweep.
async fn figures(site: &Site, scale: Scale) -> Result<(Vec<Figure>, Vec<(usize, f64, f64)>)> {
    let mut figures = Vec::new();
    println!("cold start ...");
    figures.push(cold_start(scale, Start::Defaults).await?);
    figures.push(cold_start(scale, Start::Proxies).await?);
    figures.push(cold_start(scale, Start::Traced).await?);
    println!("waiting on pages ...");
    let (pages, sweep) = waiting_on_pages(site, scale).await?;
    figures.extend(pages);
    println!("guard path and requests per task (emulator) ...");
    figures.extend(requests_per_task(site).await);
    figures.extend(polite_requests(site).await);
    figures.push(sharded_requests(site).await);
    figures.extend(proxied_requests(site).await);
    figures.push(refreshed_requests().await);
    figures.push(guard_path(scale).await);
    println!("CPU per record ...");
    figures.extend(cpu_per_record());
    println!("memory ...");
    figures.extend(memory(site, scale).await?);
    figures.push(package_size());
    Ok((figures, sweep))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The real fetcher, allowed onto the loopback site.
fn http_fetcher() -> HttpFetcher {
    let fetch = FetchSettings {
        connect_timeout: Duration::from_secs(5),
        max_body_bytes: CAP_BYTES,
        user_agent: "conveyor-worker-bench".into(),
        allow_private_networks: true,
        allowed_ports: None,
        proxies: Default::default(),
        proxy_session: Duration::from_secs(600),
        proxy_refuses_private: false,
        extra_roots: Vec::new(),
    };
    let policy = AddressPolicy::new(true, None);
    HttpFetcher::with_policy(&fetch, policy, Arc::new(SystemLookup)).expect("an HTTP client")
}

fn limits(max_concurrency: usize) -> BatchLimits {
    BatchLimits {
        max_concurrency,
        deadline_margin: Duration::from_millis(500),
    }
}

/// What every record of a timed batch must end as: the work the figure measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// Fetched and stored.
    Succeeded,
    /// Already terminal: acknowledged by the guard.
    Guarded,
}

/// One batch, timed; every record must end as `ends` says.
async fn timed_batch<P: conveyor_worker::batch::ProcessRecord>(
    worker: &P,
    records: &[SqsMessage],
    concurrency: usize,
    ends: Ends,
) -> Duration {
    let deadline = SystemTime::now() + Duration::from_secs(900);
    let started = Instant::now();
    let run = run_batch(worker, records, "bench", deadline, limits(concurrency)).await;
    let took = started.elapsed();
    let ended = match ends {
        Ends::Succeeded => run.tally.succeeded,
        Ends::Guarded => run.tally.duplicate_guarded,
    };
    assert_eq!(
        ended,
        records.len() as u64,
        "every record {ends:?}: {:?}",
        run.tally
    );
    took
}

// 1. Cold start ---------------------------------------------------------------------------

/// How the function is configured for its cold start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Every setting at its default.
    Defaults,
    /// Two proxy tiers in `PROXY_URLS` (their clients are built at their first use).
    Proxies,
    /// `TRACING=on`: the OTLP exporter is built (no collector listens).
    Traced,
}

/// Process start to the first request for an event, worker against the do-nothing floor.
async fn cold_start(scale: Scale, start: Start) -> Result<Figure> {
    // The quick pass times the debug binaries `make test` built: the path, not the figure.
    let profile = if scale.quick {
        "target/debug"
    } else {
        "target/release"
    };
    let release = workspace().join(profile);
    let worker = release.join("conveyor-worker");
    let floor = release.join("bench-floor");
    if !worker.exists() || !floor.exists() {
        return Ok(Figure {
            what: "1. Cold start (release binaries not built: `make bench` builds them)".into(),
            value: String::new(),
            floor: String::new(),
            ratio: None,
            target: "at most 1.5x".into(),
            met: None,
        });
    }
    let (mut ours, mut floors) = (Vec::new(), Vec::new());
    for _ in 0..starts(scale) {
        floors.push(first_poll(&floor, Start::Defaults).await?.as_secs_f64() * 1000.0);
        ours.push(first_poll(&worker, start).await?.as_secs_f64() * 1000.0);
    }
    let (ours, floor) = (median(ours), median(floors));
    let what = match start {
        Start::Defaults => "1. Cold start: process start to first `next` request",
        Start::Proxies => "1b. Cold start with two proxy tiers in PROXY_URLS",
        Start::Traced => "1c. Cold start with tracing on (TRACING=on, the exporter built)",
    };
    let mut figure = ratio_figure(what, ours, floor, "ms", 1.5);
    if scale.quick {
        figure
            .what
            .push_str(" (debug build: the path is checked, not the target)");
        figure.met = None;
    }
    Ok(figure)
}

/// How many times each binary is started for a cold-start figure. A start takes 2 ms and
/// moves by a tenth from one to the next on a busy machine: 41 of each, alternated, keep
/// the medians still (10 moved the ratio by 0.1x between runs).
fn starts(scale: Scale) -> usize {
    scale.runs * 8 + 1
}

/// Starts `binary` against a stand-in for the Lambda Runtime API and times its first poll.
async fn first_poll(binary: &std::path::Path, start: Start) -> Result<Duration> {
    let api = TcpListener::bind("127.0.0.1:0").await?;
    let address = api.local_addr()?.to_string();
    let started = Instant::now();
    let mut command = Command::new(binary);
    command
        .env("AWS_LAMBDA_RUNTIME_API", &address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("TABLE_NAME", "bench")
        .env("RESULTS_BUCKET", "bench")
        .env("AWS_REGION", "us-east-1")
        // Lambda always hands the function its role's credentials in the environment.
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("AWS_SESSION_TOKEN", "bench")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    match start {
        Start::Defaults => {}
        Start::Proxies => {
            command.env("PROXY_URLS", "http://127.0.0.1:3128;http://127.0.0.1:3129");
        }
        Start::Traced => {
            command.env("TRACING", "on");
        }
    }
    let mut child = command.spawn()?;
    let (mut connection, _) = tokio::time::timeout(Duration::from_secs(10), api.accept()).await??;
    let mut first = [0_u8; 1];
    connection.read_exact(&mut first).await?;
    let took = started.elapsed();
    child.kill().await?;
    Ok(took)
}

// 2. Waiting on pages ---------------------------------------------------------------------

/// 200 tasks of 100 ms pages at concurrency 32, with in-process stores, against the floor
/// ceil(200 / 32) x 100 ms; the same batch against the emulator; and a sweep of concurrency.
async fn waiting_on_pages(
    site: &Site,
    scale: Scale,
) -> Result<(Vec<Figure>, Vec<(usize, f64, f64)>)> {
    let (url, tasks) = (site.url(&format!("/slow/{PAGE_MS}")), scale.page_tasks);
    let batch = deliveries(tasks);
    let fetcher = http_fetcher();
    let floor_of = |c: usize| tasks.div_ceil(c) as f64 * PAGE_MS as f64;
    let mut runs = Vec::new();
    for _ in 0..scale.runs {
        let worker = memory::worker(fetcher.clone(), tasks, &url);
        runs.push(
            timed_batch(&worker, &batch, PAGE_CONCURRENCY, Ends::Succeeded)
                .await
                .as_secs_f64()
                * 1000.0,
        );
    }
    let ours = median(runs);
    let mut figures = vec![ratio_figure(
        &format!(
            "2. Waiting on pages: {tasks} x 100 ms pages, MAX_CONCURRENCY 32, in-process stores"
        ),
        ours,
        floor_of(PAGE_CONCURRENCY),
        "ms",
        1.25,
    )];
    let traced = traced_pages(&fetcher, &batch, &url, scale).await?;
    figures.push(ratio_figure(
        "2c. The same batch with tracing on, every task sampled, to a local OTLP receiver (floor: tracing off)",
        traced,
        ours,
        "ms",
        1.05,
    ));

    figures.push(emulated_pages(&url, &batch, floor_of(PAGE_CONCURRENCY)).await);

    let mut sweep = Vec::new();
    for &concurrency in scale.sweep {
        let mut runs = Vec::new();
        for _ in 0..scale.runs.min(3) {
            let worker = memory::worker(fetcher.clone(), tasks, &url);
            runs.push(
                timed_batch(&worker, &batch, concurrency, Ends::Succeeded)
                    .await
                    .as_secs_f64()
                    * 1000.0,
            );
        }
        sweep.push((concurrency, median(runs), floor_of(concurrency)));
    }
    Ok((figures, sweep))
}

/// The waiting-on-pages batch against the emulator, bound by moto's one request at a time.
async fn emulated_pages(url: &str, batch: &[SqsMessage], floor: f64) -> Figure {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    for i in 0..batch.len() {
        stack.put_task(&format!("t{i}"), url, "pending").await;
    }
    let worker = stack.worker();
    let emulated = timed_batch(&worker, batch, PAGE_CONCURRENCY, Ends::Succeeded)
        .await
        .as_secs_f64()
        * 1000.0;
    Figure {
        what: "2b. The same batch against the emulator (bound by moto, one request at a time)"
            .into(),
        value: format!("{emulated:.0} ms"),
        floor: format!("{floor:.0} ms"),
        ratio: Some(emulated / floor),
        target: "(emulator-bound)".into(),
        met: None,
    }
}

/// The waiting-on-pages batch with traces on: every task sampled, its spans exported to a
/// local OTLP receiver, and flushed after the batch (untimed, as after an invocation's reply).
async fn traced_pages(
    fetcher: &HttpFetcher,
    batch: &[SqsMessage],
    url: &str,
    scale: Scale,
) -> Result<f64> {
    let receiver = Receiver::start(Mode::Ok).await;
    let settings = TraceSettings {
        on: true,
        sample_rate: 1.0,
        endpoint: receiver.endpoint.clone(),
        export_timeout: Duration::from_millis(200),
    };
    let traces = traces::exporter(&settings, "bench").ok_or("no trace exporter")?;
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(traces.layer()));
    trace::switch_on(1.0);
    let mut runs = Vec::new();
    for _ in 0..scale.runs {
        let worker = memory::worker(fetcher.clone(), batch.len(), url);
        let timed = timed_batch(&worker, batch, PAGE_CONCURRENCY, Ends::Succeeded);
        let took = timed.with_subscriber(dispatch.clone()).await;
        traces.flush();
        runs.push(took.as_secs_f64() * 1000.0);
    }
    trace::switch_off();
    let (_, spans) = receiver.spans().await;
    let records = spans.iter().filter(|s| s["name"] == "record").count();
    assert_eq!(
        records,
        batch.len() * scale.runs,
        "every delivery's span exported"
    );
    Ok(median(runs))
}

// 3 and 6. Requests against the emulator --------------------------------------------------

/// The politeness a deployed function has: every default of `Config`.
fn production_politeness() -> conveyor_worker::polite::Politeness {
    let required =
        |name: &str| matches!(name, "TABLE_NAME" | "RESULTS_BUCKET").then(|| "required".to_owned());
    conveyor_worker::Config::from_lookup(required)
        .expect("the defaults")
        .politeness
}

/// AWS requests per task with politeness at its defaults (1 request a second to a host,
/// robots.txt obeyed): the host's first task (its robots.txt read and kept), a task that
/// finds its turn free, and one that must wait for it (held back, sent again).
async fn polite_requests(site: &Site) -> Vec<Figure> {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    for task in ["first", "next", "waits"] {
        stack
            .put_task(task, &site.url(&format!("/page/{task}")), "pending")
            .await;
    }
    let worker = stack.worker_with(|t| t.politeness = production_politeness());
    let mut counted = Vec::new();
    for (task, pause) in [("first", 0), ("next", 1_100), ("waits", 0)] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let records = [conveyor_testkit::delivery(task)];
        let deadline = SystemTime::now() + Duration::from_secs(60);
        let spent = counted_requests(&stack, async {
            run_batch(&worker, &records, "bench", deadline, limits(1)).await;
        });
        counted.push((task, spent.await));
    }
    let what = |task| match task {
        "first" => "6c. AWS requests, polite defaults: a host's first task (robots.txt kept)",
        "next" => "6d. AWS requests, polite defaults: a task that finds its turn free",
        _ => "6e. AWS requests, polite defaults: a task that must wait for its turn",
    };
    counted
        .into_iter()
        .map(|(task, spent)| Figure {
            what: what(task).into(),
            value: spent.to_string(),
            floor: String::new(),
            ratio: None,
            target: String::new(),
            met: None,
        })
        .collect()
}

/// AWS requests, and DynamoDB write units as billed, of one piece of work.
#[derive(Debug, Clone, Copy)]
struct Spent {
    requests: usize,
    write_units: u64,
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use conveyor_ops::count;
        let (requests, units) = (self.requests as u64, self.write_units);
        write!(
            f,
            "{}, {}",
            count(requests, "request"),
            count(units, "write unit")
        )
    }
}

/// What `work` cost: the SDK's requests and the write units the emulator counted.
async fn counted_requests(stack: &Stack, work: impl std::future::Future<Output = ()>) -> Spent {
    stack.calls.clear();
    let units = stack.layer_count("write_units").await;
    work.await;
    Spent {
        requests: stack.calls.calls().len(),
        write_units: stack.layer_count("write_units").await - units,
    }
}

/// AWS requests per successful task of a run spread over 8 counter shards (data contract
/// v3, what `submit` makes of a large list).
async fn sharded_requests(site: &Site) -> Figure {
    let stack = Stack::new().await;
    let ids: Vec<String> = (0..16).map(|i| format!("t{i}")).collect();
    stack.put_job(conveyor_testkit::JOB, "active").await;
    stack
        .put_spread_run((conveyor_testkit::JOB, conveyor_testkit::RUN), &ids, (8, 0))
        .await;
    let task = conveyor_testkit::task_ref("t3").spread_over(Some(8));
    stack
        .put_task_of(&task, &site.url("/page/a"), "pending")
        .await;
    let body = conveyor_worker::domain::message::body(&task);
    let records = [conveyor_testkit::record("t3", &body, 1)];
    let worker = stack.worker();
    let spent = counted_requests(&stack, async {
        timed_batch(&worker, &records, 1, Ends::Succeeded).await;
    })
    .await;
    Figure {
        what: "6f. AWS requests per successful task, a run spread over 8 shards (v3)".into(),
        value: spent.to_string(),
        floor: String::new(),
        ratio: None,
        target: "at most 5 requests".into(),
        met: Some(spent.requests <= 5),
    }
}

/// AWS requests per successful task through a proxy tier (tinyproxy on loopback), and
/// through the paid tier of a run with a budget (the datacenter tier blocked): its
/// reservation, its note on the lease and the give-back at the invocation's end included.
async fn proxied_requests(site: &Site) -> Vec<Figure> {
    use conveyor_testkit::forward_proxy::ForwardProxy;
    use conveyor_worker::domain::proxy::Tiers;
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let datacenter = ForwardProxy::start([127, 0, 0, 3].into(), false).await;
    let residential = ForwardProxy::start([127, 0, 0, 4].into(), false).await;
    let tiers = format!("{};{}", datacenter.url(), residential.url());
    let worker = stack.worker_with(|t| t.proxies = Tiers::parse(&tiers).expect("proxy URLs"));
    stack
        .put_task("free", &site.url("/page/free"), "pending")
        .await;
    let blocked = format!("/blocks/{}/paid", datacenter.egress);
    stack.put_task("paid", &site.url(&blocked), "pending").await;
    stack.set_paid_budget(64 << 20).await;
    let mut figures = Vec::new();
    for (task, what) in [
        (
            "free",
            "6g. AWS requests per successful task through a proxy tier",
        ),
        (
            "paid",
            "6h. AWS requests per successful task through the paid tier (budget kept)",
        ),
    ] {
        let records = [conveyor_testkit::delivery(task)];
        let spent = counted_requests(&stack, async {
            timed_batch(&worker, &records, 1, Ends::Succeeded).await;
        })
        .await;
        figures.push(Figure {
            what: what.into(),
            value: spent.to_string(),
            floor: String::new(),
            ratio: None,
            target: String::new(),
            met: None,
        });
    }
    figures
}

/// AWS requests per refreshed task: a page stored by a first run, then a task of a refresh
/// run that names it, which the site answers `304 Not Modified` (the earlier object checked
/// and copied forward); as figure 6 counts them.
async fn refreshed_requests() -> Figure {
    use conveyor_testkit::fresh_site::FreshSite;
    use conveyor_worker::store::dynamo::attributes::s;
    let (stack, site) = (Stack::new().await, FreshSite::start().await);
    stack.put_active_run().await;
    stack
        .put_task("first", &site.url("/fresh/a"), "pending")
        .await;
    let worker = stack.worker();
    let first = [conveyor_testkit::delivery("first")];
    timed_batch(&worker, &first, 1, Ends::Succeeded).await;
    let stored = stack.task("first").await;
    let mut refresh = stored.0.clone();
    refresh.retain(|name, _| matches!(name.as_str(), "pk" | "sk" | "url"));
    refresh.extend(conveyor_worker::store::dynamo::keys::task_key(
        &conveyor_testkit::task_ref("again"),
    ));
    refresh.insert("status".into(), s("pending"));
    for (from, to) in [
        ("result_key", "prior_result_key"),
        ("result_sha256", "prior_sha256"),
        ("etag", "prior_etag"),
        ("last_modified", "prior_last_modified"),
    ] {
        refresh.insert(to.into(), s(stored.s(from).unwrap_or_default()));
    }
    stack.put_item(refresh).await;
    let records = [conveyor_testkit::delivery("again")];
    let spent = counted_requests(&stack, async {
        timed_batch(&worker, &records, 1, Ends::Succeeded).await;
    })
    .await;
    assert_eq!(site.answers().1, 1, "the refresh was answered 304");
    Figure {
        what: "6i. AWS requests per refreshed task, its earlier result carried forward on a 304"
            .into(),
        value: spent.to_string(),
        floor: String::new(),
        ratio: None,
        target: String::new(),
        met: None,
    }
}

/// AWS requests per successful task and per guarded duplicate, counted by the SDK.
async fn requests_per_task(site: &Site) -> Vec<Figure> {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack.put_task("t0", &site.url("/page/a"), "pending").await;
    let worker = stack.worker();
    let batch = deliveries(1);
    let success = counted_requests(&stack, async {
        timed_batch(&worker, &batch, 1, Ends::Succeeded).await;
    })
    .await;
    let duplicate = counted_requests(&stack, async {
        timed_batch(&worker, &batch, 1, Ends::Guarded).await;
    })
    .await;
    vec![
        Figure {
            what: "6. AWS requests per successful task".into(),
            value: success.to_string(),
            floor: String::new(),
            ratio: None,
            target: "at most 5 requests".into(),
            met: Some(success.requests <= 5),
        },
        Figure {
            what: "6b. AWS requests per guarded duplicate".into(),
            value: duplicate.to_string(),
            floor: String::new(),
            ratio: None,
            target: "exactly 1 request, no write".into(),
            met: Some(duplicate.requests == 1 && duplicate.write_units == 0),
        },
    ]
}

/// A batch of 1,000 already-terminal tasks against the emulator: wall time, and one
/// DynamoDB request per record.
async fn guard_path(scale: Scale) -> Figure {
    let n = scale.guarded;
    let stack = Stack::new().await;
    stack.put_active_run().await;
    for i in 0..n {
        stack
            .put_task(&format!("t{i}"), "http://127.0.0.1:9/", "successful")
            .await;
    }
    let worker = stack.worker();
    let batch = deliveries(n);
    stack.calls.clear();
    let took = timed_batch(&worker, &batch, 16, Ends::Guarded).await;
    let calls = stack.calls.calls();
    let reads = stack.calls.count("GetItem");
    Figure {
        what: format!("3. Guard path: {n} terminal tasks (emulator)"),
        value: format!(
            "{:.0} ms, {} requests ({reads} GetItem)",
            took.as_secs_f64() * 1000.0,
            calls.len()
        ),
        floor: format!("{n} requests"),
        ratio: Some(calls.len() as f64 / n as f64),
        target: "exactly 1 request per record".into(),
        met: Some(calls.len() == n && reads == n),
    }
}

// 4. CPU per record -----------------------------------------------------------------------

/// Records per second through the whole pipeline with nothing to wait on, for batches of 10
/// and 10,000: criterion's estimates from `cargo bench --bench pipeline` (benches/pipeline.rs,
/// which `make bench` runs first).
fn cpu_per_record() -> Vec<Figure> {
    let estimates = workspace().join("target/criterion");
    let kib = memory::CPU_PAGE_BYTES / 1024;
    let bare = memory::CPU_BATCHES.into_iter().map(|size| {
        let what = format!(
            "4. CPU: records per second, batches of {size}, {kib} KiB pages, no I/O (criterion)"
        );
        (format!("pipeline/batch/{size}"), size, what)
    });
    let deployed = [
        ("logged", "JSON log lines, tracing off"),
        ("traced-1pct", "tracing on, 1% sampled"),
        ("traced", "tracing on, every task sampled"),
    ];
    let deployed = deployed.map(|(name, how)| {
        let what =
            format!("4b. CPU: records per second, batches of 10, as deployed: {how} (criterion)");
        (format!("deployed/{name}/10"), 10, what)
    });
    bare.chain(deployed)
        .map(|(id, size, what)| {
            let file = estimates.join(format!("{id}/new/estimates.json"));
            let value = match criterion_median_ns(&file) {
                Some(batch_ns) => {
                    let each_us = batch_ns / size as f64 / 1000.0;
                    format!("{:.0} records/s ({each_us:.1} µs each)", 1e6 / each_us)
                }
                None => "not measured: run `cargo bench --bench pipeline`".into(),
            };
            Figure {
                what,
                value,
                floor: String::new(),
                ratio: None,
                target: String::new(),
                met: None,
            }
        })
        .collect()
}

/// The median time of one iteration (one batch), in nanoseconds, from criterion's estimates.
fn criterion_median_ns(file: &std::path::Path) -> Option<f64> {
    let estimates: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

// 5. Memory -------------------------------------------------------------------------------

/// Peak RSS of a process running one batch of 1 MB pages at concurrency 16, for two batch
/// sizes (it must not grow with the batch), and of the same process running no batch; with
/// glibc's mmap threshold fixed as the stack deploys it, and once with glibc's default. Then
/// pages that decode to just under the 10 MB cap from gzip (no Content-Length: the buffer
/// grows as the body comes), against the memory the template reserves for them.
async fn memory(site: &Site, scale: Scale) -> Result<Vec<Figure>> {
    let url = site.url(&format!("/bytes/{MEGABYTE}"));
    let deployed = Some(("MALLOC_MMAP_THRESHOLD_", "131072"));
    let idle = median_rss(scale, 0, &url, deployed).await?;
    let mut figures = Vec::new();
    let [small, large] = scale.pages;
    for (n, env, label) in [
        (small, deployed, "as deployed"),
        (large, deployed, "as deployed"),
        (large, None, "glibc default"),
    ] {
        let mb = median_rss(scale, n, &url, env).await?;
        figures.push(Figure {
            what: format!("5. Peak RSS, {n} x 1 MB pages, MAX_CONCURRENCY 16, {label}"),
            value: format!("{mb:.1} MB"),
            floor: format!("{idle:.1} MB (same process, no batch)"),
            ratio: Some(mb / idle),
            target: "under 64 MB, flat in batch size".into(),
            met: Some(mb < 64.0),
        });
    }
    figures.push(near_the_cap(site, idle, (scale.cap_pages, deployed)).await?);
    Ok(figures)
}

/// Peak RSS of 32 gzip pages that decode to 9.5 MB each, trickled in chunks so that the 16
/// records at once all hold nearly their whole body together, against
/// `MAX_CONCURRENCY x (MAX_BODY_BYTES + RECORD_OVERHEAD_BYTES) + PROCESS_BYTES`.
async fn near_the_cap(
    site: &Site,
    idle: f64,
    (pages, env): (usize, Option<(&str, &str)>),
) -> Result<Figure> {
    use conveyor_worker::wiring::config::{PROCESS_BYTES, RECORD_OVERHEAD_BYTES};
    let url = site.url(&format!("/trickle/{}", 95 * MEGABYTE / 10));
    // The site compresses the page once, on this first request.
    reqwest::Client::builder()
        .no_proxy()
        .build()?
        .get(&url)
        .send()
        .await?
        .bytes()
        .await?;
    let mb = peak_rss(pages, &url, env).await?;
    let reserved = 16 * (CAP_BYTES + RECORD_OVERHEAD_BYTES) + PROCESS_BYTES;
    let reserved = reserved as f64 / MEGABYTE as f64;
    Ok(Figure {
        what: format!(
            "5. Peak RSS, {pages} x 9.5 MB pages, gzip and chunked (no Content-Length), \
             MAX_CONCURRENCY 16, cap 10 MB, as deployed"
        ),
        value: format!("{mb:.1} MB"),
        floor: format!("{idle:.1} MB (same process, no batch)"),
        ratio: Some(mb / idle),
        target: format!("under {reserved:.0} MB, what the template rule reserves"),
        met: Some(mb < reserved),
    })
}

/// The median of `scale.runs` processes' peak RSS (one varies by a few MB with how many
/// bodies its records hold at the same moment).
async fn median_rss(scale: Scale, n: usize, url: &str, env: Option<(&str, &str)>) -> Result<f64> {
    let mut peaks = Vec::new();
    for _ in 0..scale.runs {
        peaks.push(peak_rss(n, url, env).await?);
    }
    Ok(median(peaks))
}

/// Peak RSS in MB of a child process running a batch of `n` pages from `url`.
async fn peak_rss(n: usize, url: &str, env: Option<(&str, &str)>) -> Result<f64> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--rss", &n.to_string(), url])
        .env_remove("MALLOC_MMAP_THRESHOLD_")
        .stdin(Stdio::null());
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    let out = command.output().await?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let kb: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok(kb / 1024.0)
}

/// The child of [`memory`]: runs the batch, prints its peak RSS in kB.
async fn rss_probe(n: usize, url: &str) -> Result<()> {
    if n > 0 {
        let mut worker = memory::worker(http_fetcher(), n, url);
        // Decoding 16 large pages at once on a small machine takes a while.
        worker.settings.scrape_timeout = Duration::from_secs(120);
        timed_batch(&worker, &deliveries(n), 16, Ends::Succeeded).await;
    }
    let status = std::fs::read_to_string("/proc/self/status")?;
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no VmHWM in /proc/self/status")?;
    println!("{peak}");
    Ok(())
}

// 7. Package ------------------------------------------------------------------------------

fn package_size() -> Figure {
    let bootstrap = workspace().join(".aws-sam/build/WorkerFunction/bootstrap");
    let size = std::fs::read(&bootstrap).map(|bytes| zipped(&bytes) as f64 / MEGABYTE as f64);
    Figure {
        what: "7. Package: the arm64 bootstrap `make build` (sam build) makes, zipped".into(),
        value: size
            .as_ref()
            .map_or("not built".into(), |mb| format!("{mb:.2} MB")),
        floor: String::new(),
        ratio: None,
        target: "under 8 MB".into(),
        met: size.ok().map(|mb| mb < 8.0),
    }
}

/// The bytes deflated as a zip would hold them (what `sam deploy` uploads).
fn zipped(bytes: &[u8]) -> usize {
    use std::io::Write;
    let mut deflate =
        flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    deflate
        .write_all(bytes)
        .and_then(|()| deflate.finish())
        .map_or(bytes.len(), |zipped| zipped.len())
}

// Report ----------------------------------------------------------------------------------

fn ratio_figure(what: &str, ours: f64, floor: f64, unit: &str, target: f64) -> Figure {
    let ratio = ours / floor;
    Figure {
        what: what.into(),
        value: format!("{ours:.1} {unit}"),
        floor: format!("{floor:.1} {unit}"),
        ratio: Some(ratio),
        target: format!("at most {target}x"),
        met: Some(ratio <= target),
    }
}

fn report(figures: &[Figure], sweep: &[(usize, f64, f64)]) -> String {
    let (runs, page_tasks, starts) = (FULL.runs, FULL.page_tasks, starts(FULL));
    let mut md = String::new();
    let machine = machine();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Written by `make bench` (`scripts/with-moto target/release/bench`, release \
         profile) on {machine}, {}. Each figure is the median of {runs} runs (3 for the sweep, \
         {starts} for a cold start), beside its floor measured in the same run.\n",
        support_date()
    );
    let _ = writeln!(md, "| figure | measured | floor | ratio | target | |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for figure in figures {
        let _ = writeln!(md, "{}", figure.row());
    }
    let _ = writeln!(
        md,
        "\n## Batch wall time against MAX_CONCURRENCY\n\n{page_tasks} tasks of {PAGE_MS} ms \
         pages, in-process stores, real local HTTP site; floor = ceil({page_tasks} / c) x \
         {PAGE_MS} ms.\n\n![batch wall time against MAX_CONCURRENCY](docs/concurrency.svg)\n"
    );
    let _ = writeln!(md, "| MAX_CONCURRENCY | wall time | floor | ratio |");
    let _ = writeln!(md, "|---|---|---|---|");
    for (c, ms, floor) in sweep {
        let _ = writeln!(
            md,
            "| {c} | {ms:.0} ms | {floor:.0} ms | {:.2}x |",
            ms / floor
        );
    }
    md
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "an unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores of {cpu}")
}

fn support_date() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// A line chart, measured against floor, as SVG.
fn concurrency_chart(sweep: &[(usize, f64, f64)]) -> String {
    let page_tasks = FULL.page_tasks;
    let (width, height, margin) = (640.0, 360.0, 56.0);
    let top = sweep
        .iter()
        .map(|(_, ms, floor)| ms.max(*floor))
        .fold(1.0, f64::max);
    let x = |i: usize| margin + i as f64 * (width - 2.0 * margin) / (sweep.len() - 1).max(1) as f64;
    let y = |ms: f64| height - margin - ms / top * (height - 2.0 * margin);
    let line = |pick: fn(&(usize, f64, f64)) -> f64| {
        sweep
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(pick(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{margin}" y="24" font-size="14">Batch of {page_tasks} x {PAGE_MS} ms pages: wall time against MAX_CONCURRENCY</text>
<line x1="{margin}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/>
<line x1="{margin}" y1="{margin}" x2="{margin}" y2="{b}" stroke="black"/>
<polyline fill="none" stroke="#999" stroke-dasharray="4 3" stroke-width="2" points="{floor}"/>
<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="{measured}"/>
<text x="{legend}" y="44" fill="#1f6feb">measured (median)</text>
<text x="{legend}" y="60" fill="#999">floor: ceil({page_tasks}/c) x {PAGE_MS} ms</text>
<text x="14" y="{mid}" transform="rotate(-90 14 {mid})">ms</text>
<text x="{r}" y="{axis}" text-anchor="end">MAX_CONCURRENCY</text>
"##,
        b = height - margin,
        r = width - margin,
        floor = line(|p| p.2),
        measured = line(|p| p.1),
        legend = width - margin - 190.0,
        mid = height / 2.0,
        axis = height - 12.0,
    );
    for (i, (c, ms, _)) in sweep.iter().enumerate() {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{c}</text><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#1f6feb">{ms:.0}</text>"##,
            x(i),
            height - margin + 16.0,
            x(i),
            y(*ms) - 8.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
