//! The operator's tool: runs the worker against a queue the way Lambda's event source
//! mapping would, shows a run's progress, re-queues a run's failed tasks and replays the
//! poison quarantine. Settings come from the environment as the worker's do.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use conveyor_worker::Config;
use conveyor_worker::aws::{self, AwsWorker};
use conveyor_worker::batch::BatchLimits;
use conveyor_worker::domain::ids::Id;
use conveyor_worker::ops::local_mapping::{
    self, Ended, MappingSettings, MappingStats, Progress, Watch,
};
use conveyor_worker::ops::{progress, replay, requeue};
use conveyor_worker::store::queue::SqsQueue;
use conveyor_worker::store::results::S3ResultStore;
use conveyor_worker::store::tasks::DynamoTaskStore;
use lambda_runtime::tracing::subscriber::{EnvFilter, fmt};

#[derive(Parser)]
#[command(
    version,
    about = "Operate conveyor-worker: run it, watch runs, re-queue, replay"
)]
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
    /// Show a run's status, counters and tasks by status, and its failed tasks with why.
    Progress(RunArgs),
    /// Set a run's failed tasks back to pending (counters too, reopening a completed run)
    /// and send one message per task.
    RequeueFailed(RequeueArgs),
    /// Send each quarantined poison message's body back to the queue (once the producer or
    /// the worker is fixed).
    ReplayQuarantine(ReplayArgs),
}

#[derive(Args)]
struct RunArgs {
    /// The table (the stack's TableName output).
    #[arg(long, env = "TABLE_NAME")]
    table: String,
    #[arg(long, value_parser = parse_id)]
    job: Id,
    #[arg(long, value_parser = parse_id)]
    run: Id,
    /// How many failed tasks to list.
    #[arg(long, default_value_t = 20)]
    failures: usize,
}

#[derive(Args)]
struct RequeueArgs {
    #[command(flatten)]
    run: RunArgs,
    /// The task queue (the stack's TasksQueueUrl output).
    #[arg(long, env = "QUEUE_URL")]
    queue_url: String,
    /// Send pending tasks again too (after a re-queue whose sends failed; duplicates are
    /// harmless).
    #[arg(long)]
    resend_pending: bool,
}

#[derive(Args)]
struct ReplayArgs {
    /// The results bucket (the stack's BucketName output).
    #[arg(long, env = "RESULTS_BUCKET")]
    bucket: String,
    #[arg(long, env = "QUARANTINE_PREFIX", default_value = "quarantine/")]
    prefix: String,
    /// The task queue (the stack's TasksQueueUrl output).
    #[arg(long, env = "QUEUE_URL")]
    queue_url: String,
    /// Delete each object once its message is sent.
    #[arg(long)]
    delete: bool,
}

fn parse_id(raw: &str) -> Result<Id, String> {
    Id::parse(raw).map_err(|e| e.to_string())
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
        Command::Progress(args) => progress(args).await,
        Command::RequeueFailed(args) => requeue_failed(args).await,
        Command::ReplayQuarantine(args) => replay_quarantine(args).await,
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
    let sdk = aws::sdk_config(aws::Trust::System).await;
    let worker = AwsWorker::from_config(&config, &sdk)?;
    let queue = SqsQueue::new(aws_sdk_sqs::Client::new(&sdk), &args.queue_url);
    let queue_arn = queue.arn().await?.ok_or("the queue did not say its ARN")?;
    let settings = MappingSettings {
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
    let stats = MappingStats::default();
    let ended =
        local_mapping::run_watched(&queue, &worker, &settings, &stats, &watch, interrupted()).await;
    println!("{}: {}", describe(ended), stats.summary());
    match ended {
        Ended::TimedOut if args.until_drained => Err("the queue did not drain in time".into()),
        _ => Ok(()),
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

/// The standard AWS settings, with the system's certificate store.
async fn sdk() -> aws_config::SdkConfig {
    aws::sdk_config(aws::Trust::System).await
}

fn tasks(sdk: &aws_config::SdkConfig, table: String) -> DynamoTaskStore {
    DynamoTaskStore::new(aws_sdk_dynamodb::Client::new(sdk), table)
}

fn queue(sdk: &aws_config::SdkConfig, url: &str) -> SqsQueue {
    SqsQueue::new(aws_sdk_sqs::Client::new(sdk), url)
}

async fn progress(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let tasks = tasks(&sdk().await, args.table);
    let progress = progress::progress(&tasks, &args.job, &args.run).await?;
    println!("run {}/{}", args.job, args.run);
    for (field, value) in &progress.run {
        println!("  {field:<16} {value}");
    }
    let total: u64 = progress.by_status.values().sum();
    println!("tasks ({total}):");
    for (status, count) in &progress.by_status {
        println!("  {status:<16} {count}");
    }
    if !progress.failures.is_empty() {
        println!("failed tasks:");
        for (task, error) in progress.failures.iter().take(args.failures) {
            println!("  {task:<32} {error}");
        }
        let more = progress.failures.len().saturating_sub(args.failures);
        if more > 0 {
            println!("  ... and {more} more (--failures N lists more)");
        }
    }
    Ok(())
}

async fn requeue_failed(args: RequeueArgs) -> Result<(), Box<dyn std::error::Error>> {
    let RunArgs {
        table, job, run, ..
    } = args.run;
    let sdk = sdk().await;
    let (tasks, queue) = (tasks(&sdk, table), queue(&sdk, &args.queue_url));
    let requeued =
        requeue::requeue_failed(&tasks, &queue, (&job, &run), args.resend_pending).await?;
    println!(
        "run {job}/{run}: {} failed tasks set back to pending, {} messages sent",
        requeued.reset.len(),
        requeued.sent.len()
    );
    if !requeued.conflicted.is_empty() {
        println!("still failed: {}", requeued.conflicted.join(" "));
        return Err("concurrent writes kept conflicting with some resets: run again".into());
    }
    if !requeued.unsent.is_empty() {
        println!("not sent: {}", requeued.unsent.join(" "));
        return Err("some messages were not sent: run again with --resend-pending".into());
    }
    Ok(())
}

async fn replay_quarantine(args: ReplayArgs) -> Result<(), Box<dyn std::error::Error>> {
    let sdk = sdk().await;
    let quarantine = S3ResultStore::new(
        aws_sdk_s3::Client::from_conf(aws::s3_config(&sdk).build()),
        args.bucket,
    );
    let queue = queue(&sdk, &args.queue_url);
    let replayed =
        replay::replay_quarantine(&quarantine, &args.prefix, &queue, args.delete).await?;
    for key in &replayed.sent {
        println!("sent     {key}");
    }
    for (key, why) in &replayed.skipped {
        println!("skipped  {key}: {why}");
    }
    println!(
        "{} replayed, {} deleted, {} skipped",
        replayed.sent.len(),
        replayed.deleted.len(),
        replayed.skipped.len()
    );
    Ok(())
}
