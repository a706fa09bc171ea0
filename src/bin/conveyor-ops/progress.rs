//! `conveyor-ops progress`: a run's status, counters and tasks by status, once or until it
//! completes.

use std::time::Duration;

use clap::Args;
use conveyor_worker::ops::progress::{self, RunProgress};

use crate::report::Reporter;
use crate::{Outcome, RunArgs, sdk, tasks};

/// Show a run's status, counters and tasks by status, and its failed tasks with why.
#[derive(Args)]
pub struct ProgressArgs {
    #[command(flatten)]
    run: RunArgs,
    /// How many failed tasks to list.
    #[arg(long, default_value_t = 20)]
    failures: usize,
    /// Refresh until the run ends (completed, cancelled or failed).
    #[arg(long)]
    watch: bool,
    /// How often to refresh with --watch.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    every: Duration,
}

pub async fn run(args: ProgressArgs) -> Outcome {
    let tasks = tasks(&sdk().await, args.run.table.clone());
    let (job, run) = (&args.run.job, &args.run.run);
    let mut progress = progress::progress(&tasks, job, run).await?;
    if args.watch {
        let reporter = Reporter::new(progress.total(), "tasks ended", args.every);
        while !progress.ended() {
            reporter.set(progress.finished());
            tokio::time::sleep(args.every).await;
            progress = progress::progress(&tasks, job, run).await?;
        }
        reporter.set(progress.finished());
        reporter.finish();
    }
    print(&args, &progress);
    Ok(())
}

fn print(args: &ProgressArgs, progress: &RunProgress) {
    println!("run {}/{}", args.run.job, args.run.run);
    for (field, value) in &progress.run {
        println!("  {field:<16} {value}");
    }
    println!("tasks ({}):", progress.total());
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
}
