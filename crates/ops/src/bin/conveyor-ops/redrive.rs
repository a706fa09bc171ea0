//! `conveyor-ops redrive`: the dead-letter queue's messages shown, then moved back.

use clap::Args;
use conveyor_ops::redrive;

use crate::exit::{Exit, stop};
use crate::{Outcome, queue, sdk};

/// Show what the task queue's dead-letter queue holds (each message's task and receives),
/// and with --move send every one back to the task queue.
///
/// Listing a standard queue counts a receive on each message. A FIFO queue is listed whole
/// by moving each message to the back of its group, in order (SQS shows nothing more of a
/// group while its first messages are being read): the message ids change, and the
/// receives start again.
///
/// Fix what made them fail first (progress shows why the tasks failed): a message moved
/// back whose task fails again returns to the dead-letter queue after maxReceiveCount.
#[derive(Args)]
pub struct RedriveArgs {
    /// The task queue (the stack's TasksQueueUrl output); its redrive policy names the
    /// dead-letter queue.
    #[arg(long, env = "QUEUE_URL")]
    pub(crate) queue_url: String,
    /// Move the messages back (without it, they are only shown and left where they are).
    #[arg(long = "move")]
    move_back: bool,
    /// The most messages to read.
    #[arg(long, default_value_t = 10_000)]
    most: usize,
    /// One JSON object a line, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: RedriveArgs) -> Outcome {
    let sdk = sdk().await;
    let tasks = queue(&sdk, &args.queue_url);
    let Some(dead) = tasks.dead_letter_queue().await? else {
        let why = format!(
            "queue {} has no redrive policy: no dead-letter queue",
            args.queue_url
        );
        return Err(stop(Exit::BadInput, why));
    };
    let to = args.move_back.then_some(&tasks);
    let held = dead.depth().await?;
    let redriven = redrive::redrive(&dead, to, args.most).await?;
    for letter in &redriven.seen {
        if args.json {
            say!("{}", serde_json::to_string(letter)?);
        } else {
            let receives = letter.receives.map_or("?".into(), |n| n.to_string());
            say!(
                "{:<40} {:<48} {receives} receives",
                letter.message_id,
                letter.task
            );
        }
    }
    let seen = redriven.seen.len();
    match (args.move_back, seen) {
        (_, 0) => eprintln!("the dead-letter queue is empty"),
        (true, _) => eprintln!("{} moved back to {}", redriven.moved, args.queue_url),
        (false, n) if dead.is_fifo() => eprintln!(
            "{n} dead-lettered (each moved to the back of its group to be read, in order); \
             --move sends them back to the task queue"
        ),
        (false, n) => eprintln!(
            "{n} dead-lettered (listing counts a receive on each); --move sends them back to \
             the task queue"
        ),
    }
    let unlisted = held.saturating_sub(seen as u64);
    if !args.move_back && unlisted > 0 && seen < args.most {
        eprintln!("about {unlisted} more not listed: being read by someone else");
    }
    let Some(err) = redriven.stopped else {
        return Ok(());
    };
    if !args.move_back {
        let why = format!(
            "the listing stopped after {seen}: {err}; every message is still in the \
             dead-letter queue (one whose delete failed, twice)"
        );
        return Err(stop(Exit::Aws, why));
    }
    let left = seen - redriven.moved - redriven.sent_not_deleted;
    let also = match redriven.sent_not_deleted {
        0 => String::new(),
        n => format!(", {n} sent back but still in it too (a second redrive moves them again)"),
    };
    let why = format!(
        "the move stopped: {} moved, {left} left in the dead-letter queue (visible again){also}: {err}",
        redriven.moved
    );
    Err(stop(Exit::Aws, why))
}
