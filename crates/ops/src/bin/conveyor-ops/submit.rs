//! `conveyor-ops submit`: a list of URLs becomes a run of tasks, each with its message.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use conveyor_ops::submit;
use conveyor_worker::domain::ids::Id;
use conveyor_worker::domain::ids::RunRef;
use conveyor_worker::ports::error::StoreError;

use crate::exit::{Exit, stop};
use crate::report::Reporter;
use crate::{Outcome, parse_id, queue, sdk, tasks};

/// Create a job, a run and one task per URL (one URL a line; blank lines and # comments
/// are skipped), and send one message per task.
///
/// Every line is checked before anything is written: a line that is not an http(s) URL is
/// reported with its number, and nothing is written (unless --skip-invalid). Task ids come
/// from line numbers (t000042), so a submit that stopped half-way (a crash, Ctrl-C) can be
/// run again with the same list: nothing is written twice, the run's counters stay exact,
/// and the messages not yet sent are sent.
#[derive(Args)]
pub struct SubmitArgs {
    /// The table (the stack's TableName output).
    #[arg(long, env = "TABLE_NAME")]
    pub(crate) table: String,
    /// The task queue (the stack's TasksQueueUrl output).
    #[arg(long, env = "QUEUE_URL")]
    pub(crate) queue_url: String,
    /// The job's id (letters, digits, `-` and `_`); created if it does not exist.
    #[arg(long, value_parser = parse_id)]
    job: Id,
    /// The run's id within the job.
    #[arg(long, value_parser = parse_id)]
    run: Id,
    /// The list of URLs; `-` reads standard input.
    #[arg(long)]
    urls: PathBuf,
    /// Leave out the lines that are not URLs (they are still reported) instead of refusing.
    #[arg(long)]
    skip_invalid: bool,
    /// Counter shards of the run (data contract v2): each counts its share of the tasks, so
    /// a run completes thousands of tasks a second; 0 counts on the run item alone (v1).
    /// Default: none under 100 tasks, else one per 16 tasks, at most 16,384.
    #[arg(long)]
    counter_shards: Option<u32>,
    /// Counter groups between the shards and the run (0: none), so that the shards that
    /// finish together at the end of a run do not all write the run item. Default: one per
    /// 64 shards past 64.
    #[arg(long)]
    counter_groups: Option<u32>,
    /// This run refreshes an earlier run of the job: each task whose line had the same URL
    /// there and ended successful is given that result (its object, SHA-256, ETag and
    /// Last-Modified), and the worker asks the site whether the page changed since; an
    /// unchanged page's earlier result is carried forward, not fetched again.
    #[arg(long, value_parser = parse_id, value_name = "RUN")]
    refreshes: Option<Id>,
    /// Keep a sharded run's tasks under one partition key and its results under one prefix
    /// (data contract v2). By default they spread over its shards (v3), so a new run's
    /// writes do not wait for DynamoDB and S3 to split one hot key.
    #[arg(long)]
    no_spread: bool,
    /// How often to print progress when the output is not a terminal.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    progress_every: Duration,
    /// No progress lines: the summary alone.
    #[arg(short, long)]
    quiet: bool,
}

pub async fn run(args: SubmitArgs) -> Outcome {
    let list = checked_list(&args)?;
    let started = std::time::Instant::now();
    let sdk = sdk().await;
    let (tasks, queue) = (tasks(&sdk, args.table), queue(&sdk, &args.queue_url));
    let total = list.urls.len() as u64;
    let reporter =
        (!args.quiet).then(|| Reporter::new(total, "tasks submitted", args.progress_every));
    let report = |done| {
        if let Some(reporter) = &reporter {
            reporter.set(done);
        }
    };
    let run_ref = RunRef::new(&args.job, &args.run);
    let layout = submit::Layout {
        sharding: submit::sharding(total, args.counter_shards, args.counter_groups),
        spread: !args.no_spread,
        refreshes: args.refreshes.as_ref(),
    };
    let submitted = submit::submit(&tasks, &queue, run_ref, &list.urls, layout, &report)
        .await
        .map_err(|err| match err {
            // The run or its job refused this list (another list, a cancelled job).
            StoreError::NotAllowed { detail } => stop(Exit::BadInput, detail),
            err => err.into(),
        })?;
    if let Some(reporter) = &reporter {
        reporter.finish();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let refreshing = match &args.refreshes {
        Some(earlier) => format!(" ({} with a result of {earlier})", submitted.with_earlier),
        None => String::new(),
    };
    say!(
        "run {}/{}: {}, {} created{refreshing}, {} sent{} in {elapsed:.1} s ({:.0} a second)",
        args.job,
        args.run,
        crate::count(submitted.total, "task"),
        submitted.created,
        crate::count(submitted.sent, "message"),
        match submitted.resumed_from {
            0 => String::new(),
            n => format!(" (resumed after the first {n}, submitted before)"),
        },
        submitted.sent as f64 / elapsed.max(1e-3),
    );
    Ok(())
}

/// The list's URLs; its lines that are not URLs said on stderr, and refused unless
/// `--skip-invalid` (nothing is written then).
fn checked_list(args: &SubmitArgs) -> Result<submit::UrlList, Box<dyn std::error::Error>> {
    let list = submit::read_list(&read(&args.urls)?);
    for invalid in &list.invalid {
        eprintln!("line {}: {}", invalid.line, invalid.why);
    }
    if !list.invalid.is_empty() && !args.skip_invalid {
        let lines = list.invalid.len() as u64;
        let why = format!(
            "{} not {}; nothing was written",
            crate::count(lines, "line"),
            if lines == 1 { "a URL" } else { "URLs" }
        );
        return Err(stop(Exit::BadInput, why));
    }
    if list.urls.is_empty() {
        return Err(stop(Exit::BadInput, "the list has no URL"));
    }
    Ok(list)
}

fn read(path: &PathBuf) -> Result<String, Box<dyn std::error::Error>> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()).into())
}
