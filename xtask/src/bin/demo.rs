//! `make run`: the worker on the local stack, in two parts. First the whole ack contract:
//! serves a local site, creates and seeds a table and bucket in the emulator, runs the
//! functions under `cargo lambda watch`, invokes the worker with every sample event in
//! `events/` and the renderer with those in `events/renderer/` (a client-rendered page), and
//! prints what happened to each message and task. Then a whole run as a user makes one: a
//! list of a few hundred URLs through `conveyor-ops submit`, `poll` and `results`, with its
//! counters and every invariant checked. Exits non-zero if anything differs from the contract.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use conveyor_testkit::demo::{self, JOB, RETRIED, RUN, Seed, TASKS};
use conveyor_testkit::scenario::{self, Prepared};
use conveyor_testkit::{Site, Stack};
use tokio::process::{Child, Command};

const INVOKE_ADDRESS: &str = "127.0.0.1";
/// The worker's `cargo lambda watch`, and the renderer's (one watch serves one package).
const INVOKE_PORT: &str = "9123";
const RENDERER_PORT: &str = "9124";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let site = Site::start().await;
    let stack = Stack::new().await;
    demo::seed(&stack, &site).await;
    // This crate is `xtask/` in the workspace.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent();
    let log = workspace
        .unwrap_or(Path::new("."))
        .join("target/local-run.log");
    let function = watch(&stack, &log, None)?;
    wait_until_listening(INVOKE_PORT).await?;

    println!("\nconveyor-worker on the local stack");
    println!("  emulator  {}", conveyor_testkit::endpoint());
    println!("  site      http://{}", site.addr);
    println!("  table     {}   bucket {}\n", stack.table, stack.bucket);
    println!("{:<28} {:<20} {:<6} contract", "event", "message", "reply");
    let mut mismatches = 0;
    for file in demo::event_files()? {
        let event: SqsEvent = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
        let reply = invoke(("conveyor-worker", INVOKE_PORT), &file).await?;
        let retried: Vec<_> = reply
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for record in &event.records {
            let id = record.message_id.as_deref().unwrap_or("");
            let got = if retried.contains(&id) {
                "retry"
            } else {
                "ack"
            };
            let want = if RETRIED.contains(&id) {
                "retry"
            } else {
                "ack"
            };
            mismatches += usize::from(got != want);
            let verdict = if got == want {
                "as the contract says"
            } else {
                "WRONG: expected the other"
            };
            println!("{name:<28} {id:<20} {got:<6} {verdict}");
        }
    }

    println!(
        "\n{:<38} {:<44} {:<11} {:<6} stored object or error",
        "task", "contract row", "status", "tries"
    );
    for Seed {
        job,
        run,
        task,
        row,
        ends,
        ..
    } in TASKS
    {
        let item = stack.task_in(job, run, task).await;
        let detail = match (item.s("result_key"), item.s("error")) {
            (Some(key), _) => format!(
                "{key} ({} B, sha256 {}…)",
                item.n("result_size").unwrap_or(0),
                item.s("result_sha256")
                    .unwrap_or("")
                    .get(..12)
                    .unwrap_or("")
            ),
            (None, Some(error)) => format!("error: {error}"),
            (None, None) => String::from("-"),
        };
        let attempts = item.n("attempts").map_or("-".into(), |n| n.to_string());
        let status = item.status().unwrap_or("missing");
        let name = match (*job, *run) {
            (JOB, RUN) => task.to_string(),
            _ => format!("{job}/{run}/{task}"),
        };
        let wrong = if status == *ends {
            String::new()
        } else {
            mismatches += 1;
            format!("   WRONG: expected {ends}")
        };
        println!("{name:<38} {row:<44} {status:<11} {attempts:<6} {detail}{wrong}");
    }

    stop(function).await;
    let renderer_log = log.with_file_name("local-run-renderer.log");
    let renderer = watch(&stack, &renderer_log, Some("conveyor-renderer"))?;
    wait_until_listening(RENDERER_PORT).await?;
    let differ = rendered(&stack).await;
    stop(renderer).await;
    mismatches += differ?;
    println!(
        "\nthe functions' logs: {} and {}",
        log.display(),
        renderer_log.display()
    );
    if mismatches > 0 {
        return Err(format!("{mismatches} replies or task states differ from the contract").into());
    }
    println!("\nevery reply and every task state match the ack contract");

    whole_run().await
}

/// The renderer, under the same `cargo lambda watch`, with its sample events: a
/// client-rendered page stored with the text its script fetched. The number of replies and
/// task states that differ from the contract.
async fn rendered(stack: &Stack) -> Result<usize, Box<dyn std::error::Error>> {
    println!("\nconveyor-renderer: the same pipeline, pages rendered in headless Chromium\n");
    let mut mismatches = 0;
    for file in demo::render_event_files()? {
        let reply = invoke(("conveyor-renderer", RENDERER_PORT), &file).await?;
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let retried = reply.batch_item_failures.len();
        mismatches += retried;
        println!("{name:<28} {retried} retried (the contract: none)");
    }
    for seed in demo::RENDERED {
        let item = stack.task_in(seed.job, seed.run, seed.task).await;
        let status = item.status().unwrap_or("missing");
        mismatches += usize::from(status != seed.ends);
        let marks = match (item.0.contains_key("rendered"), item.s("error")) {
            (true, _) => "rendered".to_owned(),
            (false, Some(error)) => format!("error: {error}"),
            (false, None) => "-".to_owned(),
        };
        println!("{:<38} {:<44} {status:<11} {marks}", seed.task, seed.row);
    }
    let page = stack.task_in(JOB, demo::RENDER_RUN, "app-page").await;
    let object = match page.s("result_key") {
        Some(key) => stack.object(key).await,
        None => None,
    };
    let text = object.map(|o| String::from_utf8_lossy(&o.body).into_owned());
    let wanted = conveyor_testkit::app_site::rendered_text("demo");
    match text.as_deref().and_then(|t| t.find(&wanted)) {
        Some(at) => {
            println!("\nthe stored page holds what its script fetched: \"{wanted}\" (at byte {at})")
        }
        None => {
            mismatches += 1;
            println!("\nWRONG: the stored page lacks the text its script fetched");
        }
    }
    Ok(mismatches)
}

/// The second part: a run as a user makes one. `conveyor-ops submit` turns a list of URLs
/// into a run (and a second submit of the same list adds nothing), `conveyor-ops poll` drains
/// it as Lambda's event source mapping would, `conveyor-ops results` downloads and checks
/// what it stored; then every invariant is checked.
async fn whole_run() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "\nA whole run, as a user makes one: {RUN_TASKS} URLs over fine, flaky, gone, slow and \
         dead pages submitted with `conveyor-ops submit` (twice: the second adds nothing), \
         drained by `conveyor-ops poll` (4 pollers, batches of 10, a dead-letter queue), read \
         back with `conveyor-ops results`.\n"
    );
    let target = workspace().join("target");
    let list = target.join("demo-urls.txt");
    // Politeness at its production defaults: the list is spread over local hosts.
    let prepared = scenario::prepare_list(RUN_TASKS, &list, true).await?;
    let list = list.to_string_lossy().into_owned();
    let submit = [
        "submit",
        "--job",
        scenario_job(),
        "--run",
        scenario_run(),
        "--urls",
        &list,
    ];
    ops(
        &prepared,
        &[&submit[..], &["--queue-url", &prepared.queue.url]].concat(),
    )
    .await?;
    ops(
        &prepared,
        &[&submit[..], &["--queue-url", &prepared.queue.url]].concat(),
    )
    .await?;
    let started = Instant::now();
    let polled = poll_until_drained(&prepared).await?;
    // Drained: 0, or 4 when messages went to the dead-letter queue (the check below says
    // whether that was right).
    if !matches!(polled.code(), Some(0 | 4)) {
        return Err(format!("conveyor-ops poll failed: {polled}").into());
    }
    let seconds = started.elapsed().as_secs_f64();
    let out = target.join("demo-results");
    let out_arg = out.to_string_lossy().into_owned();
    let results = ["results", "--job", scenario_job(), "--run", scenario_run()];
    let listed = ops_output(&prepared, &[&results[..], &["--out", &out_arg]].concat()).await?;
    let (head, total) = (listed.lines().take(5), listed.lines().count());
    println!(
        "{}\n... ({total} tasks listed)",
        head.collect::<Vec<_>>().join("\n")
    );
    let report = prepared.check(None, seconds, "").await;
    println!("\n{}\n{}", report.line(), report.counters);
    println!(
        "every message was acknowledged and deleted or sits in the dead-letter queue; the \
         run's counters equal its task states; a run whose tasks all ended completed exactly \
         once; every stored page is in {} and matched its task's SHA-256",
        out.display()
    );
    Ok(())
}

fn scenario_job() -> &'static str {
    conveyor_testkit::JOB
}

fn scenario_run() -> &'static str {
    conveyor_testkit::RUN
}

/// `conveyor-ops` with these arguments against the scenario's stack, its output on this
/// terminal; an error if it fails.
async fn ops(prepared: &Prepared, args: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    let status = ops_command(prepared, args).status().await?;
    if !status.success() {
        return Err(format!("conveyor-ops {} failed: {status}", args[0]).into());
    }
    Ok(())
}

/// `conveyor-ops` with these arguments against the scenario's stack: what it printed.
async fn ops_output(
    prepared: &Prepared,
    args: &[&str],
) -> Result<String, Box<dyn std::error::Error>> {
    let out = ops_command(prepared, args).output().await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("conveyor-ops {} failed: {stderr}", args[0]).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ops_command(prepared: &Prepared, args: &[&str]) -> Command {
    println!("$ conveyor-ops {}", args.join(" "));
    let mut command = Command::new("cargo");
    command
        .args(["run", "--quiet", "-p", "conveyor-ops", "--"])
        .args(args)
        .envs(scenario::worker_env(&prepared.stack))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The workspace's root (this crate is `xtask/` in it).
fn workspace() -> std::path::PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

/// Drains the scenario's queue with `conveyor-ops poll`, its progress on this terminal.
async fn poll_until_drained(
    prepared: &Prepared,
) -> Result<std::process::ExitStatus, Box<dyn std::error::Error>> {
    let timeout = humantime::format_duration(scenario::INVOCATION_TIMEOUT).to_string();
    let status = Command::new("cargo")
        .args(["run", "--quiet", "-p", "conveyor-ops", "--", "poll"])
        .args(["--queue-url", &prepared.queue.url])
        .args(["--until-drained", "--limit", "10m", "--timeout", &timeout])
        .args(["--pollers", "4", "--wait-seconds", "1"])
        .envs(scenario::worker_env(&prepared.stack))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await?;
    Ok(status)
}

const RUN_TASKS: usize = 300;

/// A function under `cargo lambda watch`, pointed at this stack, logging to `log`: the
/// worker, or the renderer (`package`), each on its own port.
fn watch(stack: &Stack, log: &Path, package: Option<&str>) -> std::io::Result<Child> {
    let log = std::fs::File::create(log)?;
    let port = if package.is_some() {
        RENDERER_PORT
    } else {
        INVOKE_PORT
    };
    let package: &[&str] = match package {
        Some(package) => &["--package", package],
        None => &[],
    };
    Command::new("cargo")
        .args(["lambda", "watch", "--quiet", "--ignore-changes"])
        .args(package)
        .args(["--invoke-address", INVOKE_ADDRESS, "--invoke-port", port])
        // Without host limits: each sample event's reply is checked against its contract row,
        // which a host's rate would turn into a polite wait for records of one host.
        .envs(scenario::unlimited_env(stack))
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// Stops `cargo lambda watch` and the function it runs: the whole process group.
async fn stop(mut function: Child) {
    if let Some(pid) = function.id() {
        let group = format!("-{pid}");
        let _ = Command::new("kill")
            .args(["-TERM", "--", &group])
            .status()
            .await;
    }
    let _ = function.wait().await;
}

/// `cargo lambda watch` takes a moment to bind; the first invoke then builds the function.
async fn wait_until_listening(port: &str) -> Result<(), Box<dyn std::error::Error>> {
    let address = format!("{INVOKE_ADDRESS}:{port}");
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(&address).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(format!("cargo lambda watch did not listen on {address} within a minute").into())
}

/// `cargo lambda invoke` of `function` (the worker or the renderer) on the port of its
/// watch, with the event in `file`.
async fn invoke(
    (function, port): (&str, &str),
    file: &Path,
) -> Result<SqsBatchResponse, Box<dyn std::error::Error>> {
    let out = Command::new("cargo")
        .args(["lambda", "invoke", function])
        .args(["--invoke-address", INVOKE_ADDRESS, "--invoke-port", port])
        .args(["--output-format", "json", "--data-file"])
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("invoking with {}: {stderr}", file.display()).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}
