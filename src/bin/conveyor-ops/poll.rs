//! `conveyor-ops poll`: the worker against a queue, as Lambda's event source mapping runs it.

use std::time::Duration;

use clap::Args;
use conveyor_worker::Config;
use conveyor_worker::aws::{self, AwsWorker};
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::ops::local_mapping::{
    self, Ended, MappingSettings, MappingStats, Progress, Watch,
};

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
    queue_url: String,
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
    /// Stop once the queue is empty: nothing visible and nothing in flight.
    #[arg(long)]
    until_drained: bool,
    /// Stop after this long in any case (e.g. "10m").
    #[arg(long, value_parser = humantime::parse_duration)]
    limit: Option<Duration>,
    /// How often to print progress.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    progress_every: Duration,
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
    let secret = aws::proxy_secret(&config, &sdk).await?;
    let worker = AwsWorker::from_config(&config, &sdk, &secret)?;
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
    let dead_before = depth(dead_letters.as_ref()).await;
    let stats = MappingStats::default();
    let ended = watched(&args, &queue, &worker, &settings, &stats).await;
    let dead = depth(dead_letters.as_ref())
        .await
        .saturating_sub(dead_before);
    println!(
        "{}: {}, {dead} moved to the dead-letter queue",
        describe(ended),
        stats.summary()
    );
    match ended {
        Ended::TimedOut if args.until_drained => Err("the queue did not drain in time".into()),
        _ => Ok(()),
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
        println!(
            "{:>5} s  {depth} queued  {}",
            p.elapsed.as_secs(),
            p.stats.summary()
        );
    };
    let watch = Watch {
        check_every: Duration::from_secs(1),
        report_every: args.progress_every,
        until_drained: args.until_drained,
        limit: args.limit,
        report: &report,
    };
    let until = if args.until_drained {
        ", until it drains"
    } else {
        "; Ctrl-C stops"
    };
    println!(
        "polling {} with {} pollers, batches of up to {}{until}",
        queue.url(),
        settings.pollers,
        settings.batch_size,
    );
    local_mapping::run_watched(queue, worker, settings, stats, &watch, interrupted()).await
}

/// Messages in the queue, if there is one and it answers (0 otherwise).
async fn depth(queue: Option<&conveyor_worker::store::sqs::SqsQueue>) -> u64 {
    match queue {
        Some(queue) => queue.depth().await.unwrap_or(0),
        None => 0,
    }
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
    }
}
