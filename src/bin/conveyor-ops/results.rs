//! `conveyor-ops results`: what a run's tasks ended as, each stored object checked against
//! its task's record.

use std::path::PathBuf;

use clap::Args;
use conveyor_worker::ops::results::{self, Check, Options, TaskResult};

use crate::{Outcome, RunArgs, objects, sdk, tasks};

/// List a run's tasks with source URL, status and SHA-256, checking each stored object
/// against its task's record; or download the objects.
#[derive(Args)]
pub struct ResultsArgs {
    #[command(flatten)]
    run: RunArgs,
    /// The results bucket (the stack's BucketName output).
    #[arg(long, env = "RESULTS_BUCKET")]
    bucket: String,
    /// Download every stored object into this folder, named by its task id, checking its
    /// bytes against the task's SHA-256.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only the failed tasks, with why they failed.
    #[arg(long)]
    failed: bool,
    /// One JSON object a line, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ResultsArgs) -> Outcome {
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let sdk = sdk().await;
    let (tasks, objects) = (
        tasks(&sdk, args.run.table.clone()),
        objects(&sdk, args.bucket),
    );
    let options = Options {
        failed_only: args.failed,
        out: args.out.clone(),
    };
    let runs = (&args.run.job, &args.run.run);
    let found = results::results(&tasks, &objects, runs, &options).await?;
    for task in &found {
        if args.json {
            println!("{}", serde_json::to_string(task)?);
        } else {
            println!("{}", line(task));
        }
    }
    let mismatched = found
        .iter()
        .filter(|t| matches!(t.check, Check::Mismatch(_)));
    match mismatched.count() {
        0 => Ok(()),
        n => Err(format!("{n} stored objects do not match their task's record").into()),
    }
}

fn line(task: &TaskResult) -> String {
    let url = task.url.as_deref().unwrap_or("-");
    let detail = match (&task.check, task.status.as_str()) {
        (Check::Verified, _) => {
            let sha = task.sha256.as_deref().unwrap_or_default();
            format!(
                "sha256 {}  {} bytes",
                &sha[..sha.len().min(16)],
                task.size.unwrap_or(0)
            )
        }
        (Check::Mismatch(why), _) => format!("MISMATCH: {why}"),
        (_, "failed") => format!("error: {}", task.error.as_deref().unwrap_or("-")),
        _ => String::new(),
    };
    format!(
        "{:<12} {:<10} {detail:<44} {url}",
        task.task_id, task.status
    )
}
