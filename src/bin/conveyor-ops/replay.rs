//! `conveyor-ops replay-quarantine`: quarantined poison bodies back to the queue.

use clap::Args;
use conveyor_worker::ops::replay;

use crate::{Outcome, objects, queue, sdk};

/// Send each quarantined poison message's body back to the queue.
///
/// This helps after a worker bug made it refuse good bodies (fix and deploy the worker,
/// then replay). It cannot help when the producer sent bodies no worker can read: the same
/// bodies come back to the quarantine; fix the producer and have it send again.
#[derive(Args)]
pub struct ReplayArgs {
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

pub async fn run(args: ReplayArgs) -> Outcome {
    let sdk = sdk().await;
    let quarantine = objects(&sdk, args.bucket);
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
