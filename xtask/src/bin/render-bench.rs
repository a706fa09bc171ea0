//! `make bench-render`: the renderer beside a peer. A local site of client-rendered pages
//! (each an application shell whose text arrives by XHR 100-300 ms after the first paint,
//! testkit's `/app/{name}`) rendered by this project's renderer and by Crawlee's
//! PuppeteerCrawler (`benches/crawlee/`), both driving Debian's headless Chromium with
//! images, media and fonts blocked, at the same concurrency, in one run, [`ROUNDS`] times in
//! turn (the median round of each is reported). Beside them, the plain worker's fetch of
//! the same pages, once: what `render: never` stores (the shell) and costs. Each side runs
//! in a process of its own, so its CPU time and memory are its own: this binary with
//! `--ours` renders, with `--plain` fetches, and its parent measures. Writes the section of
//! BENCHMARKS.md between its markers.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conveyor_renderer::fetcher::{BrowserFetcher, RenderSettings};
use conveyor_renderer::procs;
use conveyor_testkit::Site;
use conveyor_testkit::app_site::rendered_text;
use conveyor_worker::domain::render::{RenderOptions, Selector};
use conveyor_worker::scraper::policy::{AddressPolicy, SystemLookup};
use conveyor_worker::scraper::{Ask, Fetcher, HttpFetcher};
use futures_util::StreamExt;
use serde_json::{Value, json};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Pages rendered by each side.
const PAGES: usize = 200;
/// Pages in flight at once, on each side: one per CPU of this machine.
const CONCURRENCY: usize = 2;
/// Records the plain worker fetches at once, as deployed (template.yaml, `RecordConcurrency`).
const PLAIN_CONCURRENCY: usize = 16;
/// How late every page's first byte comes, as from a site across the internet.
const TTFB_MS: usize = 100;
/// Lambda's price of arm64 time, per GB-second (us-east-1, 2026).
const PRICE_GB_S: f64 = 0.000_013_333_4;
/// The renderer's memory as deployed (template.yaml, `RendererMemorySize`), in GB.
const RENDERER_GB: f64 = 2.0;
/// The plain worker's memory as deployed (template.yaml, `MemorySize`), in GB.
const WORKER_GB: f64 = 0.25;
/// Rounds of the two renderers, in turn: the machine's noise between runs is about 10%.
const ROUNDS: usize = 3;

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, list] = args.as_slice() {
        let report = match flag.as_str() {
            "--ours" => ours(&urls_in(list)?, started).await?,
            "--plain" => plain(&urls_in(list)?, started).await?,
            other => return Err(format!("{other}: --ours or --plain").into()),
        };
        println!("{report}");
        return Ok(());
    }
    let site = Site::start().await;
    let list = std::env::temp_dir().join("render-bench-urls.txt");
    std::fs::write(&list, urls(&site).join("\n") + "\n")?;
    let (mut ours, mut peers) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ours.push(measured(own_command("--ours", &list)?, None).await?);
        let (peer, out) = crawlee_command(&list)?;
        peers.push(measured(peer, Some(&out)).await?);
    }
    let plain = measured(own_command("--plain", &list)?, None).await?;
    let section = section(&median(ours), &median(peers), &plain);
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    std::fs::write("BENCHMARKS.md", xtask::splice(&old, BEGIN, END, &section))?;
    println!("{section}");
    Ok(())
}

/// The site's pages, their first bytes [`TTFB_MS`] late, their XHR delays spread evenly
/// over 100 to 300 ms.
fn urls(site: &Site) -> Vec<String> {
    (0..PAGES)
        .map(|i| {
            let delay = 100 + (i * 7) % 201;
            site.url(&format!("/app/p{i}?delay={delay}&ttfb={TTFB_MS}"))
        })
        .collect()
}

fn urls_in(list: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(list)?;
    Ok(text
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Our side, in its own process: every page rendered through the renderer's fetcher, taken
/// once it shows `p.loaded` (the job's `render_wait_for`). The browser starts at the first
/// page, as at a cold start.
async fn ours(urls: &[String], started: Instant) -> Result<Value> {
    let fetcher = Arc::new(fetcher()?);
    let options = RenderOptions {
        wait_for: Selector::parse("p.loaded"),
        ..RenderOptions::default()
    };
    let first = std::sync::OnceLock::new();
    let want = rendered_text("");
    let want = want.trim_start_matches("rendered text of ").to_owned();
    let pages = futures_util::stream::iter(urls).map(|url| {
        let (fetcher, options, first, want) = (&fetcher, &options, &first, &want);
        async move {
            let ask = Ask {
                render: Some(options),
                ..Ask::within(Duration::from_secs(30))
            };
            let page = fetcher.fetch(url, ask).await.page;
            let _ = first.set(started.elapsed());
            page.is_ok_and(|p| String::from_utf8_lossy(&p.body).contains(want.as_str()))
        }
    });
    let ok: Vec<bool> = pages.buffer_unordered(CONCURRENCY).collect().await;
    let wall = started.elapsed().as_secs_f64();
    // The browser ends with the side, as a sandbox's ends with it; reap.py counts its processes.
    fetcher.close().await;
    let first = first.get().map_or(0.0, Duration::as_secs_f64);
    let good = ok.iter().filter(|ok| **ok).count();
    Ok(
        json!({"pages": ok.len(), "ok": good, "failed": ok.len() - good,
              "wall_s": wall, "first_page_s": first}),
    )
}

/// The plain worker's side, in its own process: every page fetched by the worker's HTTP
/// fetcher, as `render: never` stores it, [`PLAIN_CONCURRENCY`] at a time as deployed. A
/// page "has its text" only if the fetch got it.
async fn plain(urls: &[String], started: Instant) -> Result<Value> {
    let fetcher = plain_fetcher()?;
    let want = rendered_text("");
    let want = want.trim_start_matches("rendered text of ").to_owned();
    let first = std::sync::OnceLock::new();
    let pages = futures_util::stream::iter(urls).map(|url| {
        let (fetcher, first, want) = (&fetcher, &first, &want);
        async move {
            let page = fetcher
                .fetch(url, Ask::within(Duration::from_secs(30)))
                .await;
            let _ = first.set(started.elapsed());
            let page = page.page.map_err(|e| e.to_string())?;
            Ok::<bool, String>(String::from_utf8_lossy(&page.body).contains(want.as_str()))
        }
    });
    let fetched: Vec<_> = pages.buffer_unordered(PLAIN_CONCURRENCY).collect().await;
    let wall = started.elapsed().as_secs_f64();
    let failed = fetched.iter().filter(|f| f.is_err()).count();
    let good = fetched.iter().filter(|f| matches!(f, Ok(true))).count();
    let first = first.get().map_or(0.0, Duration::as_secs_f64);
    Ok(json!({"pages": fetched.len(), "ok": good, "failed": failed,
              "wall_s": wall, "first_page_s": first}))
}

/// The worker's HTTP fetcher, direct, trusting the local site's address.
fn plain_fetcher() -> Result<HttpFetcher> {
    let policy = AddressPolicy::new(false, None).trusting(["127.0.0.1".parse()?]);
    let settings = conveyor_testkit::direct_fetch_settings();
    Ok(HttpFetcher::with_policy(
        &settings,
        policy,
        Arc::new(SystemLookup),
    )?)
}

fn fetcher() -> Result<BrowserFetcher> {
    let policy = AddressPolicy::new(false, None).trusting(["127.0.0.1".parse()?]);
    let lookup = Arc::new(SystemLookup);
    let settings = RenderSettings::from_env(10 << 20)?;
    Ok(BrowserFetcher::new(
        plain_fetcher()?,
        (policy, lookup),
        settings,
    ))
}

/// This binary with `flag` (`--ours` or `--plain`).
fn own_command(flag: &str, list: &Path) -> Result<Vec<OsString>> {
    let exe = std::env::current_exe()?.into_os_string();
    Ok(vec![exe, flag.into(), list.into()])
}

/// The round whose pages per second are the median of `rounds`.
fn median(mut rounds: Vec<Value>) -> Value {
    let rate = |r: &Value| {
        let pages = r["pages"].as_f64().unwrap_or(0.0);
        pages / r["wall_s"].as_f64().unwrap_or(f64::MAX).max(1e-9)
    };
    rounds.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    rounds.swap_remove(rounds.len() / 2)
}

/// Crawlee's side (`benches/crawlee/render.mjs`), its packages installed from the lock file
/// when they are not there yet, and the file it writes its report to.
fn crawlee_command(list: &Path) -> Result<(Vec<OsString>, PathBuf)> {
    let dir = PathBuf::from("benches/crawlee");
    if !dir.join("node_modules").exists() {
        let installed = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .env("PUPPETEER_SKIP_DOWNLOAD", "1")
            .current_dir(&dir)
            .status()?;
        if !installed.success() {
            return Err("npm ci failed in benches/crawlee".into());
        }
    }
    let out = std::env::temp_dir().join("render-bench-crawlee.json");
    let script = dir.join("render.mjs").into_os_string();
    let command = vec![
        "node".into(),
        script,
        list.into(),
        CONCURRENCY.to_string().into(),
        out.clone().into_os_string(),
    ];
    Ok((command, out))
}

/// Runs one side (`command`) under `benches/reap.py`, the peer's own instrument: its report
/// (the last JSON line it prints, or the file `out` it writes), with the CPU time of every
/// process it ever started (reap.py is their subreaper, so none escapes the count) and the
/// peak of their summed resident memory, sampled every 50 ms.
async fn measured(command: Vec<OsString>, out: Option<&Path>) -> Result<Value> {
    let reaped = std::env::temp_dir().join("render-bench.reap");
    let mut child = tokio::process::Command::new("python3")
        .arg("benches/reap.py")
        .arg(&reaped)
        .args(command)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("no pid")?;
    let mut peak = 0_u64;
    while child.try_wait()?.is_none() {
        // A process id fits an i32 on Linux (pid_max is at most 2^22).
        let root = i32::try_from(pid).unwrap_or(i32::MAX);
        peak = peak.max(procs::descendants_resident_bytes(root));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        return Err(format!("a side of the benchmark failed: {}", output.status).into());
    }
    let text = match out {
        Some(file) => std::fs::read_to_string(file)?,
        None => String::from_utf8_lossy(&output.stdout).into_owned(),
    };
    let mut report: Value = match text.lines().rev().find(|l| l.starts_with('{')) {
        Some(line) if out.is_none() => serde_json::from_str(line)?,
        _ => serde_json::from_str(&text)?,
    };
    // reap.py's line: elapsed, user and system CPU seconds, the largest single RSS, ...
    let line = std::fs::read_to_string(&reaped)?;
    let numbers: Vec<f64> = line
        .split(' ')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let cpu = numbers.get(1).copied().unwrap_or(0.0) + numbers.get(2).copied().unwrap_or(0.0);
    report["peak_rss_mb"] = json!(peak as f64 / (1 << 20) as f64);
    report["cpu_s"] = json!(cpu);
    Ok(report)
}

const BEGIN: &str = xtask::RENDER_SECTION.0;
const END: &str = xtask::RENDER_SECTION.1;

/// The section of BENCHMARKS.md: both renderers and the plain fetch, and what a million
/// pages cost on Lambda.
fn section(ours: &Value, peer: &Value, plain: &Value) -> String {
    let row = |name: &str, r: &Value, gb: f64| {
        let pages = r["pages"].as_f64().unwrap_or(0.0).max(1.0);
        let wall = r["wall_s"].as_f64().unwrap_or(0.0);
        let cpu = r["cpu_s"].as_f64().unwrap_or(0.0);
        let per_s = pages / wall.max(1e-9);
        let dollars = 1e6 / per_s * gb * PRICE_GB_S;
        format!(
            "| {name} | {:.0}/{:.0} | {per_s:.2} | {:.4} | {:.0} | {:.2} | {gb} GB | ${dollars:.2} |",
            r["ok"].as_f64().unwrap_or(0.0),
            pages,
            cpu / pages,
            r["peak_rss_mb"].as_f64().unwrap_or(0.0),
            r["first_page_s"].as_f64().unwrap_or(0.0),
        )
    };
    format!(
        "{BEGIN}\n## Rendering beside a peer\n\n\
         {PAGES} client-rendered pages of a local site (each an application shell, its first \
         byte {TTFB_MS} ms late, whose text \
         arrives by XHR 100-300 ms after its first paint), {CONCURRENCY} at a time on this \
         {CONCURRENCY}-CPU machine, by each side in turn, {ROUNDS} rounds (the median round \
         of each is shown), both driving Debian's \
         `chromium-headless-shell` with images, media and fonts blocked, each page taken once \
         `p.loaded` shows. CPU is every process each side started, counted by \
         `benches/reap.py` as their subreaper; memory is their summed resident peak, sampled \
         every 50 ms. The plain worker's fetch of the same pages (what `render: never` \
         stores: the shell, without the text), {PLAIN_CONCURRENCY} at a time as deployed, is \
         shown beside them. The cost is a million \
         pages at this rate on one arm64 sandbox of the memory shown (the template's \
         defaults) at Lambda's ${PRICE_GB_S} per GB-second \
         (`make bench-render`; docs/performance.md has the method).\n\n\
         | side | pages with their text | pages/s | CPU s/page | peak RSS MB | cold start to first page, s | memory | per million pages |\n\
         |---|---|---|---|---|---|---|---|\n{}\n{}\n{}\n{END}\n",
        row("conveyor-renderer", ours, RENDERER_GB),
        row("Crawlee PuppeteerCrawler", peer, RENDERER_GB),
        row("conveyor-worker, plain fetch", plain, WORKER_GB),
    )
}
