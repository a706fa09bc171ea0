//! The domain: what a task, its job and run look like to the worker, and how a task ends.

use bytes::Bytes;

use crate::domain::bounds::{ContentType, Reason, UrlText};
use crate::domain::ids::{Id, ResultKey};
use crate::domain::refresh::{Prior, Validators};

/// A task's lifecycle: `pending -> processing -> successful | failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    Pending,
    Processing,
    Successful,
    Failed,
}

impl TaskStatus {
    pub const ALL: [Self; 4] = [
        Self::Pending,
        Self::Processing,
        Self::Successful,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Successful => "successful",
            Self::Failed => "failed",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Successful | Self::Failed)
    }
}

/// What the guard reads of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub status: TaskStatus,
    /// As the producer wrote it. The scraper checks it, not this type.
    pub url: Option<String>,
    /// A refresh task's earlier result, when the producer gave a whole and valid one.
    pub prior: Option<Prior>,
    /// Its tries so far: the claims of its current set, and when that set began.
    pub tries: Tries,
    /// The task's own `render`, over its job's.
    pub render: Option<crate::domain::render::Render>,
}

/// A task's current set of tries. `attempts` counts its claims, and every fetch follows a
/// claim. `since` is when the message that began the set was sent, in ms since the epoch.
/// It is `None` until the worker has written it. `spent` says whether the final attempt
/// failed for a reason on our side (`tries_spent`). Then the task's messages go to the
/// dead-letter queue and the task is left open. `written` is when the item was last
/// written (`updated_at`), in ms since the epoch: the previous release wrote no `since`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tries {
    pub attempts: u32,
    pub since: Option<u64>,
    pub spent: bool,
    pub written: Option<u64>,
}

impl Tries {
    /// Whether a message begins a fresh set of tries. `since` is when the tries of the
    /// message's chain of copies began. The set is fresh when that is more than `gap_ms`
    /// after this set began, as for a message back from the dead-letter queue or a re-queue.
    /// An item the previous release wrote keeps no start of its set. Its set began before
    /// its last write, so a message sent more than `gap_ms` after that write begins a fresh
    /// set. Otherwise the item's tries count on from its attempts.
    pub fn fresh_for(&self, since: Option<u64>, gap_ms: u64) -> bool {
        let current = self.since.or(self.written);
        matches!((current, since), (Some(current), Some(new)) if new > current.saturating_add(gap_ms))
    }
}

/// The statuses of a task's job and run (`None` when the item is gone), and how the run
/// counts its tasks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parents {
    pub job_status: Option<String>,
    pub run_status: Option<String>,
    pub counting: Counting,
    /// The job's own host limits and robots.txt choice.
    pub politeness: crate::domain::limits::JobPoliteness,
    /// How the job's pages are checked for block pages (`block_detection`,
    /// `block_signatures`).
    pub detection: crate::domain::blocks::Detection,
    /// The run's budget, in bytes, for the paid (last) proxy tier (`paid_tier_budget_bytes`).
    pub paid_budget: Option<u64>,
    /// When the job's pages are rendered in a browser, and how (`render`, `render_*`).
    pub render: crate::domain::render::RenderOptions,
}

impl Parents {
    /// Work is wanted only while the job is `active` and the run `running`.
    pub fn want_work(&self) -> bool {
        self.job_status.as_deref() == Some("active")
            && self.run_status.as_deref() == Some("running")
    }
}

/// Where a task is counted when it ends: on its run's own item (data contract v1), or on
/// one of the run's counter shards, picked from the task id (v2: `counter_shards` on the
/// run item).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Counting {
    #[default]
    Run,
    Shards(Sharding),
}

impl Counting {
    /// The run item's `counter_shards` and `counter_groups`, when it has them. 0 counts as
    /// none.
    pub fn of(counter_shards: Option<u32>, counter_groups: Option<u32>) -> Self {
        match counter_shards {
            Some(shards) if shards > 0 => Self::Shards(Sharding {
                shards,
                groups: counter_groups.unwrap_or(0),
            }),
            _ => Self::Run,
        }
    }
}

/// A run's counter tree (data contract v2). The `shards` count its tasks. With `groups`
/// (0 means none), each group counts its shards not yet done, and the run counts its
/// groups. Without groups, the run counts its shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    pub shards: u32,
    pub groups: u32,
}

impl Sharding {
    /// The counter shard of a task: the first four bytes of the SHA-256 of its id,
    /// big-endian, modulo `shards`. Producers compute the same to size each shard.
    pub fn shard_of(&self, task: &Id) -> u32 {
        crate::domain::ids::shard_of(task, self.shards)
    }

    /// The group of a shard: `shard` modulo `groups`, when the run has groups.
    pub fn group_of(&self, shard: u32) -> Option<u32> {
        (self.groups > 0).then(|| shard % self.groups)
    }
}

/// A run's counter tree as its producer sizes it: the tasks in each shard, the shards with
/// tasks in each group, and what the run counts. Only counters with something to count
/// start as not done. An empty shard is done from the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSizes {
    pub sharding: Sharding,
    pub shard_tasks: Vec<u64>,
}

impl ShardSizes {
    pub fn of<'a>(sharding: Sharding, tasks: impl IntoIterator<Item = &'a Id>) -> Self {
        let mut shard_tasks = vec![0; sharding.shards as usize];
        for task in tasks {
            shard_tasks[sharding.shard_of(task) as usize] += 1;
        }
        Self {
            sharding,
            shard_tasks,
        }
    }

    /// How many shards with tasks each group has (empty without groups).
    pub fn group_shards(&self) -> Vec<u64> {
        let mut groups = vec![0; self.sharding.groups as usize];
        for (shard, tasks) in self.shard_tasks.iter().enumerate() {
            if let Some(group) = self.sharding.group_of(shard as u32)
                && *tasks > 0
            {
                groups[group as usize] += 1;
            }
        }
        groups
    }

    /// What the run item counts as left: its groups with shards (`groups_remaining`), or
    /// without groups its shards with tasks (`shards_remaining`).
    pub fn run_children(&self) -> (&'static str, u64) {
        let non_empty = |counts: &[u64]| counts.iter().filter(|n| **n > 0).count() as u64;
        match self.sharding.groups {
            0 => ("shards_remaining", non_empty(&self.shard_tasks)),
            _ => ("groups_remaining", non_empty(&self.group_shards())),
        }
    }
}

/// A page as fetched: the bytes exactly as served, with what the response said of them.
/// A `304 Not Modified` answer to a conditional request is a page too, with no body. The
/// earlier result is then the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The URL as requested, normalised (ASCII).
    pub url: String,
    pub http_status: u16,
    pub final_url: UrlText,
    pub content_type: ContentType,
    pub body: Bytes,
    /// The response's `ETag` and `Last-Modified`, where valid.
    pub validators: Validators,
    /// The page was rendered in a browser (the renderer's), with what it asked for.
    pub rendered: Option<crate::domain::render::Rendering>,
    /// A PNG of the rendered page, when its job asked for one (`render_screenshot`): stored
    /// beside it, at [`ResultKey::screenshot`](crate::domain::ids::ResultKey::screenshot).
    pub screenshot: Option<Bytes>,
}

/// The status of a response that says the earlier result still stands.
pub const NOT_MODIFIED: u16 = 304;

impl Page {
    /// A `304 Not Modified`: the site confirmed the earlier result.
    pub fn not_modified(&self) -> bool {
        self.http_status == NOT_MODIFIED
    }
}

/// A result object as it stands in S3, whoever stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    pub key: ResultKey,
    pub sha256: String,
    pub size: u64,
    pub http_status: u16,
    pub content_type: ContentType,
    pub final_url: UrlText,
    /// The validators of the response it was stored from (or confirmed by).
    pub validators: Validators,
    /// Carried forward from an earlier result on a `304 Not Modified`. Nothing was fetched.
    pub not_modified: bool,
    /// The application shell rule the stored page met, if it is one (`domain/shells.rs`).
    pub shell: Option<crate::domain::shells::ShellRule>,
    /// The stored page was rendered in a browser.
    pub rendered: Option<crate::domain::render::Rendering>,
    /// Why it was rendered: the reason its task was handed over to the renderer with (the
    /// delivery's, not kept on the object, so every delivery of the task writes the same).
    pub render_reason: Option<crate::domain::shells::ShellRule>,
}

/// Why a task failed, as written on the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub http_status: Option<u16>,
}

impl StoredResult {
    /// The least that describes the object. A record refused as invalid falls back to this.
    pub fn minimal(&self) -> Self {
        Self {
            content_type: ContentType::default(),
            final_url: UrlText::default(),
            validators: Validators::default(),
            ..self.clone()
        }
    }
}

/// The one terminal write a task gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Terminal {
    Succeeded(StoredResult),
    Failed(Failure),
}

impl Terminal {
    pub fn status(&self) -> TaskStatus {
        match self {
            Self::Succeeded(_) => TaskStatus::Successful,
            Self::Failed(_) => TaskStatus::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn an_item_without_the_start_of_its_set_is_fresh_only_for_a_message_sent_long_after_its_last_write()
     {
        // Arrange: an item as the previous release wrote it, last written at 10 000 ms.
        let previous = Tries {
            attempts: 5,
            written: Some(10_000),
            ..Tries::default()
        };

        // Act
        let (redriven, on_time) = (
            previous.fresh_for(Some(10_000 + 60_001), 60_000),
            previous.fresh_for(Some(9_000), 60_000),
        );

        // Assert
        assert!(redriven, "sent more than the gap after its last write");
        assert!(!on_time, "its set's own message: the tries count on");
    }

    #[test]
    fn a_task_always_lands_in_the_same_shard_and_tasks_spread_over_all_shards() {
        let id = |i: usize| Id::parse(&format!("t{i:06}")).unwrap();
        let sharding = Sharding {
            shards: 16,
            groups: 0,
        };
        assert_eq!(sharding.shard_of(&id(42)), sharding.shard_of(&id(42)));
        // The documented formula, by hand: the first bytes of sha256("t000042").
        let digest = Sha256::digest(b"t000042");
        let by_hand = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % 16;
        assert_eq!(sharding.shard_of(&id(42)), by_hand);
        let mut per_shard = [0_u32; 16];
        for i in 0..16_000 {
            per_shard[sharding.shard_of(&id(i)) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (800..1200).contains(n)),
            "{per_shard:?}"
        );
    }
}

/// What a delivery does when another one holds the same task at the same moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicatePolicy {
    /// Both scrape. The first stored object wins, and the other delivery converges on it.
    Converge,
    /// The claim takes a lease until the invocation's deadline. A delivery that finds
    /// another invocation's live lease does not scrape, and is retried after the lease.
    Lease,
}

impl std::str::FromStr for DuplicatePolicy {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        match value {
            "converge" => Ok(Self::Converge),
            "lease" => Ok(Self::Lease),
            _ => Err(()),
        }
    }
}

/// A claim's lease under `DUPLICATE_POLICY=lease`: who holds the task, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease<'a> {
    pub owner: &'a str,
    pub until: std::time::SystemTime,
}

/// Which set of tries a claim counts in: from `since` (ms since the epoch), the task's
/// current set, or, when `fresh`, a new one that starts at this claim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TriesFrom {
    pub since: Option<u64>,
    pub fresh: bool,
}
