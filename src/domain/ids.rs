//! Validated identifiers: the three ids a message names, and the S3 key derived only from them.

use std::fmt;

use sha2::{Digest, Sha256};

/// Longest id the data contract allows.
pub const MAX_ID_LEN: usize = 128;

/// Why a string is not an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("is empty")]
    Empty,
    #[error("is longer than {MAX_ID_LEN} characters")]
    TooLong,
    #[error("has a character outside [A-Za-z0-9._-]")]
    BadCharacter,
}

/// A job, run or task id: 1 to 128 characters of `[A-Za-z0-9._-]`.
///
/// The alphabet keeps ids safe inside DynamoDB keys (no `#`) and S3 keys (no `/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id(String);

impl Id {
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if raw.is_empty() {
            return Err(IdError::Empty);
        }
        if raw.len() > MAX_ID_LEN {
            return Err(IdError::TooLong);
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if !raw.bytes().all(allowed) {
            return Err(IdError::BadCharacter);
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The task a message points at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskRef {
    pub job_id: Id,
    pub run_id: Id,
    pub task_id: Id,
    /// Data contract v3: the run's `counter_shards`. The run's tasks are spread over this
    /// many partition keys, one per shard, and its results over [`RESULT_SPREAD`] prefixes.
    /// `None` for v1 and v2, which use one partition key and one prefix per run.
    pub spread: Option<u32>,
}

/// A run, named by its job's id and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunRef<'a> {
    pub job_id: &'a Id,
    pub run_id: &'a Id,
}

impl<'a> RunRef<'a> {
    pub fn new(job_id: &'a Id, run_id: &'a Id) -> Self {
        Self { job_id, run_id }
    }
}

/// The most counter shards a v3 run may spread over. Each shard is one task partition key.
pub const MAX_SPREAD: u32 = 65_536;

/// The result prefixes a v3 run's objects spread over (two hex digits).
pub const RESULT_SPREAD: u32 = 256;

impl TaskRef {
    /// The task's run.
    pub fn run(&self) -> RunRef<'_> {
        RunRef::new(&self.job_id, &self.run_id)
    }

    /// A task of a run that keeps one partition key and one result prefix (v1, v2).
    pub fn new(job_id: Id, run_id: Id, task_id: Id) -> Self {
        Self {
            job_id,
            run_id,
            task_id,
            spread: None,
        }
    }

    /// The same task in a run spread over `shards` (v3), or not (`None`).
    pub fn spread_over(self, shards: Option<u32>) -> Self {
        Self {
            spread: shards,
            ..self
        }
    }

    /// The task's shard among the run's `spread` ones, if the run is spread (v3).
    pub fn shard(&self) -> Option<u32> {
        self.spread.map(|shards| shard_of(&self.task_id, shards))
    }
}

/// A task's counter shard among `shards`: the first four bytes of the SHA-256 of its id,
/// big-endian, modulo `shards`. Producers compute the same.
pub fn shard_of(task: &Id, shards: u32) -> u32 {
    let digest = Sha256::digest(task.as_str().as_bytes());
    let first = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    first % shards.max(1)
}

/// Where a task's result lives in S3: `<prefix><job_id>/<run_id>/<task_id>`.
///
/// Derived from the ids alone, so every delivery of a task computes the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResultKey(String);

impl ResultKey {
    pub fn for_task(prefix: &str, task: &TaskRef) -> Self {
        let (job, run, id) = (&task.job_id, &task.run_id, &task.task_id);
        match task.spread {
            None => Self(format!("{prefix}{job}/{run}/{id}")),
            Some(_) => Self(format!("{prefix}{}/{job}/{run}/{id}", spread_prefix(task))),
        }
    }

    /// A key read back from storage. It is trusted because only [`ResultKey::for_task`]
    /// writes them.
    pub fn from_stored(key: String) -> Self {
        Self(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Where the rendered page's PNG is kept: beside it, as `<key>~screenshot.png`. No id
    /// holds a `~`, so it is no task's result key.
    pub fn screenshot(&self) -> ResultKey {
        Self(format!("{}~screenshot.png", self.0))
    }
}

/// A v3 result's first key segment: the first byte of the SHA-256 of
/// `<job_id>/<run_id>/<task_id>`, as two hex digits. So a run's objects spread over 256
/// prefixes, which S3 partitions separately.
fn spread_prefix(task: &TaskRef) -> String {
    let named = format!("{}/{}/{}", task.job_id, task.run_id, task.task_id);
    format!("{:02x}", Sha256::digest(named.as_bytes())[0])
}

impl fmt::Display for ResultKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a poison message is kept: `<prefix><message id>.json`. Characters of the message
/// id outside the id alphabet are replaced by `_`, so the key stays one plain path segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuarantineKey(String);

impl QuarantineKey {
    pub fn for_message(prefix: &str, message_id: &str) -> Self {
        let safe: String = message_id
            .chars()
            .take(MAX_ID_LEN)
            .map(|c| match c {
                'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
                _ => '_',
            })
            .collect();
        let safe = if safe.is_empty() {
            "no-message-id".into()
        } else {
            safe
        };
        Self(format!("{prefix}{safe}.json"))
    }

    /// The key a replayed message was quarantined under before, from its [`REPLAYED_FROM`]
    /// attribute. `None` unless it is a valid key under this prefix. So a replayed body that
    /// is poison again is written to the same object, never to a new one beside it.
    pub fn replayed(prefix: &str, key: &str) -> Option<Self> {
        let id = key.strip_prefix(prefix)?.strip_suffix(".json")?;
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let fits = !id.is_empty() && id.len() <= MAX_ID_LEN && id.chars().all(plain);
        fits.then(|| Self(key.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The message attribute in which `conveyor-ops replay-quarantine` names a replayed body's
/// quarantine object.
pub const REPLAYED_FROM: &str = "conveyor-quarantine-key";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_the_whole_alphabet_up_to_128_characters() {
        assert!(Id::parse("Az09._-").is_ok());
        assert!(Id::parse(&"a".repeat(MAX_ID_LEN)).is_ok());
    }

    #[test]
    fn ids_refuse_empty_long_and_foreign_characters() {
        assert_eq!(Id::parse(""), Err(IdError::Empty));
        assert_eq!(
            Id::parse(&"a".repeat(MAX_ID_LEN + 1)),
            Err(IdError::TooLong)
        );
        for bad in ["a#b", "a/b", "a b", "é", "a\0", "a:b"] {
            assert_eq!(Id::parse(bad), Err(IdError::BadCharacter), "{bad:?}");
        }
    }

    #[test]
    fn a_replayed_messages_key_is_kept_only_if_this_prefix_could_have_made_it() {
        let key = |k| QuarantineKey::replayed("quarantine/", k).map(|k| k.0);
        assert_eq!(
            key("quarantine/0b1c-9f.json").as_deref(),
            Some("quarantine/0b1c-9f.json")
        );
        for bad in [
            "quarantine/../x.json",
            "other/a.json",
            "quarantine/a/b.json",
            "quarantine/.json",
            "quarantine/a",
        ] {
            assert_eq!(key(bad), None, "{bad}");
        }
    }

    #[test]
    fn quarantine_keys_stay_one_plain_segment() {
        let key = |id| {
            QuarantineKey::for_message("quarantine/", id)
                .as_str()
                .to_owned()
        };
        assert_eq!(key("0b1c-9f"), "quarantine/0b1c-9f.json");
        assert_eq!(key("../../etc"), "quarantine/.._.._etc.json");
        assert_eq!(key(""), "quarantine/no-message-id.json");
    }

    #[test]
    fn result_key_depends_only_on_prefix_and_ids() {
        let task = TaskRef::new(
            Id::parse("j1").unwrap(),
            Id::parse("r1").unwrap(),
            Id::parse("t1").unwrap(),
        );
        assert_eq!(
            ResultKey::for_task("results/", &task).as_str(),
            "results/j1/r1/t1"
        );
        // v3: the first byte of sha256("j1/r1/t1") in front (by hand: 0x1c...).
        let spread = task.spread_over(Some(64));
        let digest = Sha256::digest(b"j1/r1/t1");
        assert_eq!(
            ResultKey::for_task("results/", &spread).as_str(),
            format!("results/{:02x}/j1/r1/t1", digest[0])
        );
    }
}
