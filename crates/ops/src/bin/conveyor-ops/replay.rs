//! `conveyor-ops replay-quarantine`: quarantined poison bodies back to the queue.

use clap::Args;
use conveyor_ops::replay;

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
    pub(crate) bucket: String,
    /// Where the worker quarantines poison messages (its QUARANTINE_PREFIX).
    #[arg(long, env = "QUARANTINE_PREFIX", default_value = "quarantine/")]
    prefix: String,
    /// The task queue (the stack's TasksQueueUrl output).
    #[arg(long, env = "QUEUE_URL")]
    pub(crate) queue_url: String,
    /// Delete each object once its message is sent; the messages wait --hold in the queue,
    /// so a body still poison is quarantined again, under the same key, after the delete.
    #[arg(long)]
    delete: bool,
    /// With --delete: how long each replayed message waits in the queue (at most 15m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    hold: std::time::Duration,
    /// Only list what is quarantined and why; send nothing.
    #[arg(long)]
    list: bool,
    /// With --list: one JSON object a line.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ReplayArgs) -> Outcome {
    let sdk = sdk().await;
    let quarantine = objects(&sdk, args.bucket);
    if args.list {
        let listed = replay::list_quarantine(&quarantine, &args.prefix).await?;
        for item in &listed {
            if args.json {
                say!("{}", serde_json::to_string(item)?);
            } else {
                say!(
                    "{}  {}  {}\n    body: {}",
                    item.key,
                    item.quarantined_at,
                    item.reason,
                    item.body
                );
            }
        }
        let listed = crate::count(listed.len() as u64, "message");
        eprintln!("{listed} quarantined under {}", args.prefix);
        return Ok(());
    }
    let queue = queue(&sdk, &args.queue_url);
    let delete = args.delete.then_some(args.hold);
    let replayed = replay::replay_quarantine(&quarantine, &args.prefix, &queue, delete).await?;
    for key in &replayed.sent {
        say!("sent     {key}");
    }
    for (key, why) in &replayed.skipped {
        say!("skipped  {key}: {why}");
    }
    say!(
        "{} replayed, {} deleted, {} skipped",
        crate::count(replayed.sent.len() as u64, "message"),
        replayed.deleted.len(),
        replayed.skipped.len()
    );
    Ok(())
}
