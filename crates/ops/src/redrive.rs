//! `conveyor-ops redrive`: what the dead-letter queue holds, each message with its task and
//! receive count. When asked, it moves every one back to the task queue. A FIFO queue is
//! listed whole by moving each message to the back of its group.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};

use conveyor_worker::domain::message;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::ports::queue::{Attribute, MessageCopy};
use conveyor_worker::store::sqs::{SqsQueue, to_record};
use conveyor_worker::trace;

/// One dead-lettered message, as an operator reads it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadLetter {
    pub message_id: String,
    /// `job/run/task`, or why the body names no task.
    pub task: String,
    /// Deliveries SQS counted before it gave up.
    pub receives: Option<u64>,
}

/// What a redrive saw and did.
#[derive(Debug, Default)]
pub struct Redriven {
    pub seen: Vec<DeadLetter>,
    /// Messages sent back to the task queue and deleted from the dead-letter queue.
    pub moved: usize,
    /// Messages sent back whose deletion from the dead-letter queue failed: they are in
    /// both queues (the worker absorbs the duplicate; a second redrive moves them again).
    pub sent_not_deleted: usize,
    /// What stopped the move part way: the rest were left in the dead-letter queue,
    /// visible again at once.
    pub stopped: Option<StoreError>,
}

/// How long a message read by a redrive stays hidden. The redrive makes every one it did
/// not move visible again at its end, also after a failure. A message that comes back
/// before then, because the listing took longer, is recognised by its id.
const HIDDEN_SECONDS: i32 = 300;

/// Reads up to `most` messages of `dead`, each once. With `to`, it sends each one there and
/// deletes it from `dead`. The send comes first, so a crash in between leaves a duplicate,
/// which the worker absorbs. A send or delete that fails stops the move: what moved is
/// counted, and the rest is made visible again. Without `to`, it makes them visible again,
/// as they were. It stops when the queue has none left to read, or returns only messages it
/// read already. Reading a message counts a receive on it (SQS's `ApproximateReceiveCount`).
pub async fn redrive(
    dead: &SqsQueue,
    to: Option<&SqsQueue>,
    most: usize,
) -> Result<Redriven, StoreError> {
    let mut redriven = Redriven::default();
    // Each message read and not moved, by id, with its latest receipt handle. Only that one
    // releases it.
    let mut held: HashMap<String, Message> = HashMap::new();
    let read = match (to, dead.is_fifo()) {
        (None, true) => list_fifo(dead, most, &mut redriven, &mut held).await,
        _ => read_all(dead, to, most, &mut redriven, &mut held).await,
    };
    let held: Vec<&Message> = held.values().collect();
    for chunk in held.chunks(10) {
        dead.release(chunk).await?;
    }
    read.map(|()| redriven)
}

/// The reading loop of [`redrive`]: moves what it reads (with `to`) or holds it in `held`.
/// A failed move stops it with `redriven.stopped`; a failed read is its error.
async fn read_all(
    dead: &SqsQueue,
    to: Option<&SqsQueue>,
    most: usize,
    redriven: &mut Redriven,
    held: &mut HashMap<String, Message>,
) -> Result<(), StoreError> {
    let mut read: HashSet<String> = HashSet::new();
    while redriven.seen.len() < most && redriven.stopped.is_none() {
        let batch = dead.receive_hidden(10, 1, Some(HIDDEN_SECONDS)).await?;
        let mut new = 0;
        for message in batch {
            let id = message.message_id().unwrap_or_default().to_owned();
            let first_read = read.insert(id.clone());
            if first_read {
                new += 1;
                redriven.seen.push(described(&message));
            }
            match to {
                Some(to) if redriven.stopped.is_none() => {
                    move_one(dead, to, message, first_read, redriven, held).await;
                }
                _ => {
                    held.insert(id, message);
                }
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(())
}

/// The deduplication id of a FIFO listing's copies starts with this, the listing's name and
/// `#`, then names the message it copies.
const LISTED: &str = "list#";

/// Lists a FIFO dead-letter queue whole. SQS returns nothing more of a message group while
/// its earlier messages are hidden, so each message listed is moved to the back of its group:
/// sent again as it is (body, group, attributes), then deleted. A group ends when the first
/// copy this listing made of it comes round; that copy stays hidden until the end. The
/// order within each group is kept; the message ids change, and receive counts start again.
/// A send or delete that fails stops the listing with `redriven.stopped`.
async fn list_fifo(
    dead: &SqsQueue,
    most: usize,
    redriven: &mut Redriven,
    held: &mut HashMap<String, Message>,
) -> Result<(), StoreError> {
    let listing = format!("{LISTED}{:016x}#", fastrand::u64(..));
    while redriven.seen.len() < most && redriven.stopped.is_none() {
        let batch = dead.receive_hidden(10, 1, Some(HIDDEN_SECONDS)).await?;
        let mut new = 0;
        for message in batch {
            let id = message.message_id().unwrap_or_default().to_owned();
            if copied_by(&message, &listing) || redriven.stopped.is_some() {
                held.insert(id, message);
                continue;
            }
            new += 1;
            redriven.seen.push(described(&message));
            if let Err(err) = to_back(dead, &message, &listing).await {
                redriven.stopped = Some(err);
                held.insert(id, message);
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(())
}

/// Whether `message` is a copy made by the listing named `listing`.
fn copied_by(message: &Message, listing: &str) -> bool {
    let dedup = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageDeduplicationId));
    dedup.is_some_and(|id| id.starts_with(listing))
}

/// Moves `message` to the back of its group in `dead`: a copy as it is, then the delete.
async fn to_back(dead: &SqsQueue, message: &Message, listing: &str) -> Result<(), StoreError> {
    let record = to_record(message, "");
    let id = message.message_id().unwrap_or_default();
    let copy = MessageCopy {
        body: message.body().unwrap_or_default().to_owned(),
        delay: Duration::ZERO,
        group: record.attributes.get("MessageGroupId").cloned(),
        deduplication: Some(format!("{listing}{id}")),
        attributes: Attribute::all_of(&record),
        trace_header: trace::carried(&record).map(str::to_owned),
    };
    dead.send_copy(&copy).await?;
    dead.delete(&[message]).await
}

/// Sends one message to `to` and deletes it from `dead` (one read before is only deleted:
/// it was moved, and its deletion did not take). On a failure the move stops, and a message
/// not deleted is held, to be made visible again.
async fn move_one(
    dead: &SqsQueue,
    to: &SqsQueue,
    message: Message,
    first_read: bool,
    redriven: &mut Redriven,
    held: &mut HashMap<String, Message>,
) {
    let id = message.message_id().unwrap_or_default().to_owned();
    if first_read && let Err(err) = to.send_copy(&moved(&message, to.is_fifo())).await {
        redriven.stopped = Some(err);
        held.insert(id, message);
        return;
    }
    match dead.delete(&[&message]).await {
        Ok(()) => redriven.moved += usize::from(first_read),
        Err(err) => {
            redriven.sent_not_deleted += usize::from(first_read);
            redriven.stopped = Some(err);
            held.insert(id, message);
        }
    }
}

/// What goes back to the task queue for a dead-lettered message. It carries the producer's
/// fields alone, so the task gets a fresh set of tries. It keeps the message's group (a fair
/// queue's tenant, a FIFO queue's order) and message attributes. On a FIFO queue, the copy's
/// deduplication id comes from the dead-lettered message. So a redrive that stopped between
/// its send and its delete, and is run again within SQS's five minutes, sends it once.
fn moved(message: &Message, fifo: bool) -> MessageCopy {
    let record = to_record(message, "");
    let dedup = message.message_id().map(|id| format!("redrive#{id}"));
    MessageCopy {
        body: fresh_body(message.body()),
        delay: Duration::ZERO,
        group: record.attributes.get("MessageGroupId").cloned(),
        deduplication: dedup.filter(|_| fifo),
        attributes: Attribute::all_of(&record),
        trace_header: trace::carried(&record).map(str::to_owned),
    }
}

/// The body sent back to the task queue: the producer's fields alone, so the task gets a
/// fresh set of tries. A body that names no task goes back as it was.
fn fresh_body(body: Option<&str>) -> String {
    match message::Message::parse(body, None) {
        Ok(message) => message.redriven(),
        Err(_) => body.unwrap_or_default().to_owned(),
    }
}

fn described(message: &Message) -> DeadLetter {
    let task = match message::parse_body(message.body()) {
        Ok(task) => format!("{}/{}/{}", task.job_id, task.run_id, task.task_id),
        Err(poison) => format!("(no task: {})", poison.0),
    };
    let receives = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|n| n.parse().ok());
    DeadLetter {
        message_id: message.message_id().unwrap_or_default().to_owned(),
        task,
        receives,
    }
}
