//! The domain: what a task, its job and run look like to the worker, and how a task ends.

use bytes::Bytes;

use sha2::{Digest, Sha256};

use crate::domain::bounds::{ContentType, Reason, UrlText};
use crate::domain::ids::{Id, ResultKey};

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
    /// As the producer wrote it; checked by the scraper, not here.
    pub url: Option<String>,
}

/// The statuses of a task's job and run (`None`: the item is gone), and how the run counts
/// its tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parents {
    pub job_status: Option<String>,
    pub run_status: Option<String>,
    pub counting: Counting,
}

/// Where a task is counted when it ends: its run's own item (data contract v1), or one of
/// the run's counter shards (v2: `counter_shards` on the run item), picked from the task id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Counting {
    #[default]
    Run,
    Shards(u32),
}

impl Counting {
    /// The run item's `counter_shards`, when there is one (0 counts as none).
    pub fn of(counter_shards: Option<u32>) -> Self {
        match counter_shards {
            Some(n) if n > 0 => Self::Shards(n),
            _ => Self::Run,
        }
    }
}

/// The counter shard of a task among `shards`: the first four bytes of the SHA-256 of its id,
/// big-endian, modulo `shards` (producers compute the same to size each shard).
pub fn shard_of(task: &Id, shards: u32) -> u32 {
    let digest = Sha256::digest(task.as_str().as_bytes());
    let first = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    first % shards.max(1)
}

/// A page as fetched: the bytes exactly as served, with what the response said of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The URL as requested, normalised (ASCII).
    pub url: String,
    pub http_status: u16,
    pub final_url: UrlText,
    pub content_type: ContentType,
    pub body: Bytes,
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
}

/// Why a task failed, as written on the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub http_status: Option<u16>,
}

impl StoredResult {
    /// The least that describes the object: what a record refused as invalid falls back to.
    pub fn minimal(&self) -> Self {
        Self {
            content_type: ContentType::default(),
            final_url: UrlText::default(),
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

    #[test]
    fn a_task_always_lands_in_the_same_shard_and_tasks_spread_over_all_shards() {
        let id = |i: usize| Id::parse(&format!("t{i:06}")).unwrap();
        assert_eq!(shard_of(&id(42), 16), shard_of(&id(42), 16));
        // The documented formula, by hand: sha256("t000042") starts with these bytes.
        let digest = Sha256::digest(b"t000042");
        let by_hand = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % 16;
        assert_eq!(shard_of(&id(42), 16), by_hand);
        let mut per_shard = [0_u32; 16];
        for i in 0..16_000 {
            per_shard[shard_of(&id(i), 16) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (800..1200).contains(n)),
            "{per_shard:?}"
        );
    }
}
