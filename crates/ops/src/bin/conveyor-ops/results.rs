//! `conveyor-ops results`: what a run's tasks ended as, each stored object checked against
//! its task's record.

use std::path::PathBuf;

use clap::Args;
use conveyor_ops::results::{self, Check, Options, TaskResult};
use conveyor_worker::domain::blocks::is_block_reason;
use conveyor_worker::domain::ids::RunRef;

use crate::exit::{Exit, stop};
use crate::{Outcome, RunArgs, objects, sdk, tasks};

/// List a run's tasks with source URL, status and SHA-256, checking each stored object
/// against its task's record; or download the objects.
#[derive(Args)]
pub struct ResultsArgs {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// The results bucket (the stack's BucketName output).
    #[arg(long, env = "RESULTS_BUCKET")]
    pub(crate) bucket: String,
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
    /// No task lines: the summary alone.
    #[arg(short, long)]
    quiet: bool,
}

pub async fn run(args: ResultsArgs) -> Outcome {
    let started = std::time::Instant::now();
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let sdk = sdk().await;
    let (tasks, objects) = (
        tasks(&sdk, args.run.table.clone()),
        objects(&sdk, args.bucket.clone()),
    );
    let options = Options {
        failed_only: args.failed,
        out: args.out.clone(),
    };
    let run_ref = RunRef::new(&args.run.job, &args.run.run);
    let found = results::results(&tasks, &objects, run_ref, &options).await?;
    for task in found.iter().filter(|_| !args.quiet) {
        if args.json {
            say!("{}", serde_json::to_string(task)?);
        } else {
            say!("{}", line(task));
        }
    }
    let tally = Tally::of(&found);
    // On stderr: standard output is the tasks alone, for scripts.
    eprintln!("{}", tally.summary(started.elapsed()));
    tally.ending(&args)
}

/// The run's tasks counted as they ended.
#[derive(Debug, Default)]
struct Tally {
    successful: usize,
    failed: usize,
    /// Failed on a block page (`blocked: ...`).
    blocked: usize,
    /// Stored an application shell (`shell`).
    shells: usize,
    /// Stored a page rendered in a browser (`rendered`).
    rendered: usize,
    open: usize,
    mismatched: usize,
    bytes: u64,
    /// Carried forward on a `304 Not Modified`, and their bytes (not fetched again).
    not_modified: usize,
    bytes_not_fetched: u64,
}

impl Tally {
    fn of(found: &[TaskResult]) -> Self {
        let mut tally = Tally::default();
        for task in found {
            match task.status.as_str() {
                "successful" => tally.successful += 1,
                "failed" => {
                    tally.failed += 1;
                    let reason = task.error.as_deref().unwrap_or_default();
                    tally.blocked += usize::from(is_block_reason(reason));
                }
                _ => tally.open += 1,
            }
            tally.mismatched += usize::from(matches!(task.check, Check::Mismatch(_)));
            tally.bytes += task.size.unwrap_or(0);
            if task.not_modified {
                tally.not_modified += 1;
                tally.bytes_not_fetched += task.size.unwrap_or(0);
            }
            tally.shells += usize::from(task.shell.is_some());
            tally.rendered += usize::from(task.rendered);
        }
        tally
    }

    fn summary(&self, elapsed: std::time::Duration) -> String {
        let listed = self.successful + self.failed + self.open;
        let rate = listed as f64 / elapsed.as_secs_f64().max(1e-3);
        let mut notes = Vec::new();
        if self.not_modified > 0 {
            notes.push(format!(
                "{} not modified, their {} bytes not fetched again",
                self.not_modified, self.bytes_not_fetched
            ));
        }
        if self.rendered > 0 {
            notes.push(format!("{} rendered", self.rendered));
        }
        if self.shells > 0 {
            notes.push(crate::count(self.shells as u64, "application shell"));
        }
        let refreshed = match notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", notes.join("; ")),
        };
        let blocked = match self.blocked {
            0 => String::new(),
            n => format!(" ({n} on a block page)"),
        };
        format!(
            "{}: {} successful{refreshed}, {} failed{blocked}, {} not ended; {} bytes stored, \
             {} not matching their record; in {:.1} s ({rate:.0} a second)",
            crate::count(listed as u64, "task"),
            self.successful,
            self.failed,
            self.open,
            self.bytes,
            self.mismatched,
            elapsed.as_secs_f64(),
        )
    }

    /// A mismatch fails; tasks not ended yet leave the results incomplete.
    fn ending(&self, args: &ResultsArgs) -> Outcome {
        if self.mismatched > 0 {
            let n = self.mismatched;
            return Err(stop(
                Exit::Failed,
                format!(
                    "{} not matching their task's record",
                    crate::count(n as u64, "stored object")
                ),
            ));
        }
        if self.open > 0 && !args.failed {
            let n = self.open;
            return Err(stop(
                Exit::Incomplete,
                format!(
                    "{} not ended yet: the results are incomplete",
                    crate::count(n as u64, "task")
                ),
            ));
        }
        Ok(())
    }
}

fn line(task: &TaskResult) -> String {
    let url = task.url.as_deref().unwrap_or("-");
    let detail = match (&task.check, task.status.as_str()) {
        (Check::Verified, _) => {
            let sha = task.sha256.as_deref().unwrap_or_default();
            let carried = if task.not_modified {
                "  not modified"
            } else {
                ""
            };
            let rendered = if task.rendered { "  rendered" } else { "" };
            let shell = task.shell.as_ref().map(|rule| format!("  shell ({rule})"));
            format!(
                "sha256 {}  {} bytes{carried}{rendered}{}",
                &sha[..sha.len().min(16)],
                task.size.unwrap_or(0),
                shell.unwrap_or_default()
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
