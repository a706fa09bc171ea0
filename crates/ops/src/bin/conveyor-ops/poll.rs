//! `conveyor-ops poll`: the worker against a queue, as Lambda's event source mapping runs it.

use std::time::{Duration, Instant};

use clap::Args;
use conveyor_ops::local_mapping::{self, Ended, MappingSettings, MappingStats, Progress, Watch};
use conveyor_worker::Config;
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::wiring::aws::{self, AwsWorker};

use crate::exit::{Exit, stop};
use crate::{Outcome, queue};

/// Run the worker against a queue, as Lambda's event source mapping would.
///
/// Long-polls batches from the queue, runs each through the worker, deletes exactly the
/// acknowledged messages and leaves the reported ones to come back after their visibility
/// timeout (the queue's redrive policy moves repeat failures to its dead-letter queue). The
/// worker reads its settings (TABLE_NAME, RESULTS_BUCKET, ...) from the environment, as in
/// Lambda, and AWS ones the standard way (AWS_ENDPOINT_URL for a local emulator).
#[derive(Args)]
pub struct PollArgs {
    /// The queue to poll.
    #[arg(long, env = "QUEUE_URL")]
    pub(crate) queue_url: String,
    /// Concurrent pollers, like concurrent Lambda instances.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pollers: u16,
    /// Messages per batch (SQS returns at most 10).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..=10))]
    batch_size: i32,
    /// Long-poll wait per receive, in seconds.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(i32).range(0..=20))]
    wait_seconds: i32,
    /// The timeout each batch gets, like the function's; keep it below the queue's
    /// visibility timeout and above DEADLINE_MARGIN_MS.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Stop once the queue is empty: nothing visible, in flight or delayed (stopped before,
    /// by Ctrl-C or --limit, it exits 3).
    #[arg(long)]
    until_drained: bool,
    /// Stop after this long in any case (e.g. "10m").
    #[arg(long, value_parser = humantime::parse_duration)]
    limit: Option<Duration>,
    /// How often to print progress.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    progress_every: Duration,
    /// Give up (exit code 5) once every SQS call has failed for this long.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    give_up_after: Duration,
    /// No progress lines: the summary alone.
    #[arg(short, long)]
    quiet: bool,
    /// The summary as one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: PollArgs) -> Outcome {
    let config = Config::from_env()?;
    if args.timeout <= config.deadline_margin {
        return Err(format!(
            "--timeout {} leaves no time: the worker stops DEADLINE_MARGIN_MS ({}) before \
             the deadline",
            humantime::format_duration(args.timeout),
            humantime::format_duration(config.deadline_margin)
        )
        .into());
    }
    let sdk = aws::sdk_config(aws::Trust::System).await;
    let shared = aws::SharedSdk::loaded(sdk.clone());
    let secret = aws::proxy_secret(&config, &shared).await?;
    let worker = AwsWorker::from_config(&config, &shared, &secret)?;
    let queue = queue(&sdk, &args.queue_url);
    let settings = MappingSettings {
        queue_arn: queue.arn().await?.ok_or("the queue did not say its ARN")?,
        pollers: usize::from(args.pollers),
        batch_size: args.batch_size,
        wait_seconds: args.wait_seconds,
        timeout: args.timeout,
        limits: BatchLimits::from(&config),
    };
    let dead_letters = queue.dead_letter_queue().await?;
    let dead_before = depth(dead_letters.as_ref()).await?;
    let (stats, started) = (MappingStats::default(), Instant::now());
    let ended = watched(&args, &queue, &worker, &settings, &stats).await;
    let dead = match ended {
        // SQS is out of reach: its dead letters cannot be counted now.
        Ended::Unreachable => 0,
        _ => depth(dead_letters.as_ref())
            .await?
            .saturating_sub(dead_before),
    };
    summary(&args, (ended, started.elapsed()), &stats, dead)?;
    verdict(&args, ended, &stats, dead)
}

/// The exit code of a poll that ended: AWS out of reach, dead letters, not drained, done.
fn verdict(args: &PollArgs, ended: Ended, stats: &MappingStats, dead: u64) -> Outcome {
    match ended {
        Ended::Unreachable => {
            let (failing, last) = stats.failing_for().unwrap_or_default();
            let failing = humantime::format_duration(Duration::from_secs(failing.as_secs()));
            let why = format!(
                "queue {}: every SQS call failed for {failing}: {last}",
                args.queue_url
            );
            Err(stop(Exit::Aws, why))
        }
        _ if dead > 0 => Err(stop(
            Exit::DeadLettered,
            format!(
                "{} went to the dead-letter queue (conveyor-ops redrive shows them)",
                crate::count(dead, "message")
            ),
        )),
        Ended::TimedOut if args.until_drained => {
            Err(stop(Exit::Incomplete, "the queue did not drain in time"))
        }
        Ended::Stopped if args.until_drained => {
            Err(stop(Exit::Incomplete, "stopped before the queue drained"))
        }
        _ => Ok(()),
    }
}

/// The end-of-run summary: what the mapping did, how long, how fast, what dead-lettered.
fn summary(
    args: &PollArgs,
    (ended, elapsed): (Ended, Duration),
    stats: &MappingStats,
    dead: u64,
) -> Outcome {
    let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
    let acked = load(&stats.deleted);
    let rate = acked as f64 / elapsed.as_secs_f64().max(1e-3);
    if args.json {
        let summary = serde_json::json!({
            "ended": describe(ended),
            "elapsed_seconds": elapsed.as_secs_f64(),
            "batches": load(&stats.batches),
            "received": load(&stats.received),
            "acknowledged": acked,
            "left_for_retry": load(&stats.retried),
            "dead_lettered": dead,
            "failed_sqs_calls": load(&stats.sqs_errors),
            "acknowledged_per_second": rate,
            "tasks_successful": load(&stats.successful),
            "tasks_failed": load(&stats.failed),
            "already_ended_or_not_wanted": load(&stats.without_work),
            "bytes_stored": load(&stats.bytes_stored),
        });
        say!("{summary}");
        return Ok(());
    }
    let elapsed = humantime::format_duration(Duration::from_secs(elapsed.as_secs()));
    say!(
        "{} after {elapsed}: {}; {} acknowledged a second; {dead} moved to the dead-letter \
         queue",
        describe(ended),
        stats.summary(),
        format_rate(rate)
    );
    Ok(())
}

/// A rate as a person reads it: whole numbers from 10 up, one decimal below.
fn format_rate(rate: f64) -> String {
    if rate >= 10.0 {
        format!("{rate:.0}")
    } else {
        format!("{rate:.1}")
    }
}

/// The mapping, with progress lines, until it drains, times out or Ctrl-C.
async fn watched(
    args: &PollArgs,
    queue: &conveyor_worker::store::sqs::SqsQueue,
    worker: &AwsWorker,
    settings: &MappingSettings,
    stats: &MappingStats,
) -> Ended {
    let report = |p: &Progress<'_>| {
        let depth = p.depth.map_or_else(|| "?".into(), |d| d.to_string());
        say!(
            "{:>5} s  {depth} queued  {}",
            p.elapsed.as_secs(),
            p.stats.summary()
        );
    };
    let quiet = |_: &Progress<'_>| {};
    let watch = Watch {
        check_every: Duration::from_secs(1),
        report_every: args.progress_every,
        until_drained: args.until_drained,
        limit: args.limit,
        give_up_after: args.give_up_after,
        report: if args.quiet || args.json {
            &quiet
        } else {
            &report
        },
    };
    let until = if args.until_drained {
        ", until it drains"
    } else {
        "; Ctrl-C stops"
    };
    if !args.quiet && !args.json {
        say!(
            "polling {} with {} pollers, batches of up to {}{until}",
            queue.url(),
            settings.pollers,
            settings.batch_size,
        );
    }
    local_mapping::run_watched(queue, worker, settings, stats, &watch, interrupted()).await
}

/// Messages in the dead-letter queue, if there is one (0 otherwise); an error names it.
async fn depth(
    queue: Option<&conveyor_worker::store::sqs::SqsQueue>,
) -> Result<u64, Box<dyn std::error::Error>> {
    let Some(queue) = queue else {
        return Ok(0);
    };
    queue.depth().await.map_err(|err| {
        let why = format!(
            "the dead-letter queue {} could not be read: {err}",
            queue.url()
        );
        stop(Exit::Aws, why)
    })
}

/// Ctrl-C; without a signal handler, never (run until drained).
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn describe(ended: Ended) -> &'static str {
    match ended {
        Ended::Drained => "drained",
        Ended::TimedOut => "time limit reached",
        Ended::Stopped => "stopped",
        Ended::Unreachable => "SQS out of reach",
    }
}
