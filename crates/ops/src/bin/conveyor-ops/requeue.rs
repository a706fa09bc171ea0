//! `conveyor-ops requeue-failed`: a run's failed tasks back to pending, one message each.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use conveyor_ops::requeue;
use conveyor_worker::domain::ids::RunRef;

use crate::{Outcome, RunArgs, queue, sdk, tasks};

/// Set a run's failed tasks back to pending (counters too, reopening a completed run) and
/// send one message per task.
#[derive(Args)]
pub struct RequeueArgs {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// The task queue (the stack's TasksQueueUrl output).
    #[arg(long, env = "QUEUE_URL")]
    pub(crate) queue_url: String,
    /// Send the tasks not ended (pending or processing) again too: after a re-queue whose
    /// sends failed, or a stall whose messages are gone (duplicates are harmless).
    #[arg(long, alias = "resend-pending")]
    resend_open: bool,
}

pub async fn run(args: RequeueArgs) -> Outcome {
    let RunArgs { table, job, run } = args.run;
    let sdk = sdk().await;
    let (tasks, queue) = (tasks(&sdk, table), queue(&sdk, &args.queue_url));
    // Ctrl-C stops the re-queue after the resets made so far are sent, never between a
    // reset and its message.
    let stop = Arc::new(AtomicBool::new(false));
    let interrupt = Arc::clone(&stop);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.store(true, Ordering::Relaxed);
        }
    });
    let run_ref = RunRef::new(&job, &run);
    let requeued =
        requeue::requeue_failed(&tasks, &queue, run_ref, args.resend_open, &stop).await?;
    say!(
        "run {job}/{run}: {} set back to pending, {} sent",
        crate::count(requeued.reset.len() as u64, "failed task"),
        crate::count(requeued.sent.len() as u64, "message")
    );
    if !requeued.conflicted.is_empty() {
        say!("still failed: {}", requeued.conflicted.join(" "));
        return Err("concurrent writes kept conflicting with some resets: run again".into());
    }
    if !requeued.unsent.is_empty() {
        say!("not sent: {}", requeued.unsent.join(" "));
        return Err("some messages were not sent: run again with --resend-open".into());
    }
    if let Some(why) = requeued.stopped {
        return Err(format!("stopped before the run's last task ({why}): run again").into());
    }
    Ok(())
}
