//! The operator's tool: runs the worker against a queue the way Lambda's event source
//! mapping would (locally, against an emulator or a real queue), with the worker's own
//! configuration from the environment.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use conveyor_worker::Config;
use conveyor_worker::aws::{self, AwsWorker};
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::esm::{self, Ended, EsmSettings, EsmStats, Progress, Watch};
use lambda_runtime::tracing::subscriber::{EnvFilter, fmt};

#[derive(Parser)]
#[command(version, about = "Operate conveyor-worker: run it against a queue")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker against a queue, as Lambda's event source mapping would.
    ///
    /// Long-polls batches from the queue, runs each through the worker, delete exactly the acknowledged messages and leave the
    /// reported ones to come back after their visibility timeout (the queue's redrive
    /// policy moves repeat failures to its dead-letter queue). The worker reads its
    /// settings (TABLE_NAME, RESULTS_BUCKET, ...) from the environment, as in Lambda, and
    /// AWS ones the standard way (AWS_ENDPOINT_URL for a local emulator).
    Poll(PollArgs),
}

#[derive(Args)]
struct PollArgs {
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
    /// visibility timeout.
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

#[tokio::main]
async fn main() -> ExitCode {
    fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Poll(args) => poll(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("conveyor-ops: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn poll(args: PollArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let sdk = aws::sdk_config().await;
    let worker = AwsWorker::from_config(&config, &sdk)?;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_arn = esm::queue_arn(&sqs, &args.queue_url)
        .await?
        .ok_or("the queue did not say its ARN")?;
    let settings = EsmSettings {
        queue_url: args.queue_url,
        queue_arn,
        pollers: usize::from(args.pollers),
        batch_size: args.batch_size,
        wait_seconds: args.wait_seconds,
        timeout: args.timeout,
        limits: BatchLimits::from(&config),
    };
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
    println!(
        "polling {} with {} pollers, batches of up to {}{}",
        settings.queue_url,
        settings.pollers,
        settings.batch_size,
        if args.until_drained {
            ", until it drains"
        } else {
            "; Ctrl-C stops"
        }
    );
    let stats = EsmStats::default();
    let interrupted = async {
        // Without a signal handler there is nothing to wait for: run until drained.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let ended = esm::run_watched(&sqs, &worker, &settings, &stats, &watch, interrupted).await;
    println!("{}: {}", describe(ended), stats.summary());
    match ended {
        Ended::TimedOut if args.until_drained => Err("the queue did not drain in time".into()),
        _ => Ok(()),
    }
}

fn describe(ended: Ended) -> &'static str {
    match ended {
        Ended::Drained => "drained",
        Ended::TimedOut => "time limit reached",
        Ended::Stopped => "stopped",
    }
}
