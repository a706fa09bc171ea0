//! The result store port. The first object stored under a task's key wins: a page, or an
//! earlier result carried forward on a `304 Not Modified`. Poison messages are also kept
//! here, for a person.

use std::future::Future;
use std::time::SystemTime;

use crate::domain::ids::{QuarantineKey, ResultKey};
use crate::domain::model::{Page, StoredResult};
use crate::domain::refresh::{Prior, Validators};
use crate::domain::shells::ShellRule;
use crate::ports::error::StoreError;

/// A page on its way into the store.
#[derive(Debug, Clone, Copy)]
pub struct NewResult<'a> {
    pub key: &'a ResultKey,
    pub page: &'a Page,
    pub sha256: &'a str,
    pub fetched_at: SystemTime,
    /// The application shell rule the page met, if it is one.
    pub shell: Option<&'a ShellRule>,
}

/// The result of a conditional put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Stored,
    /// An object was already under the key. It stays, and the caller adopts it.
    AlreadyThere,
}

/// An earlier result whose bytes are the ones its task names. `version` is its version now,
/// which a copy of it is conditional on. `stored` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Earlier {
    pub version: String,
    pub stored: StoredResult,
}

/// What checking an earlier result found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EarlierCheck {
    /// Boxed: an earlier result is a refresh's, and the reason is the common answer.
    Usable(Box<Earlier>),
    /// Why it cannot be used: it is gone, it lacks a SHA-256 checksum or the metadata that
    /// describes it, or it is not the bytes its task names.
    Unusable(String),
}

/// An earlier result on its way to a task's key, confirmed by a `304 Not Modified`.
#[derive(Debug, Clone, Copy)]
pub struct Carried<'a> {
    pub key: &'a ResultKey,
    pub earlier: &'a Earlier,
    /// The task's URL, and the validators the 304 confirmed.
    pub url: &'a str,
    pub validators: &'a Validators,
    pub fetched_at: SystemTime,
}

/// The result of a conditional copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copied {
    Stored,
    /// An object was already under the key. It stays, and the caller adopts it.
    AlreadyThere,
    /// The earlier object changed since it was checked: nothing was copied.
    EarlierChanged,
}

/// The start of a stored object, and its version (S3's ETag), which a replacement names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    pub bytes: Vec<u8>,
    pub etag: String,
}

/// Where result objects live.
pub trait ResultStore: Send + Sync {
    /// Stores the page only if nothing is stored under the key yet.
    fn put_if_absent(
        &self,
        new: NewResult<'_>,
    ) -> impl Future<Output = Result<Put, StoreError>> + Send;

    /// Describes the object under the key from its metadata, or `None` when there is none.
    fn describe(
        &self,
        key: &ResultKey,
    ) -> impl Future<Output = Result<Option<StoredResult>, StoreError>> + Send;

    /// The object's first `most` bytes and its version, or `None` when there is none.
    fn opening(
        &self,
        key: &ResultKey,
        most: usize,
    ) -> impl Future<Output = Result<Option<Opening>, StoreError>> + Send;

    /// Stores the page in place of the object of version `etag`, a block page an earlier
    /// release stored. `AlreadyThere` when the object is no longer that version.
    fn replace(
        &self,
        new: NewResult<'_>,
        etag: &str,
    ) -> impl Future<Output = Result<Put, StoreError>> + Send;

    /// The earlier result of a refresh task. The check compares the SHA-256 the store
    /// computed of its bytes with the one the task names.
    fn check_earlier(
        &self,
        prior: &Prior,
    ) -> impl Future<Output = Result<EarlierCheck, StoreError>> + Send;

    /// Copies a checked earlier result to the task's key, only if nothing is stored there
    /// yet and the earlier object is still the version checked.
    fn carry_if_absent(
        &self,
        carried: Carried<'_>,
    ) -> impl Future<Output = Result<Copied, StoreError>> + Send;

    /// Copies a checked earlier result to the task's key in place of the object of version
    /// `etag`, a block page an earlier release stored, only if the earlier object is still
    /// the version checked. `AlreadyThere` when the object under the key is no longer that
    /// version.
    fn carry_replacing(
        &self,
        carried: Carried<'_>,
        etag: &str,
    ) -> impl Future<Output = Result<Copied, StoreError>> + Send;

    /// Keeps a poison message (a JSON document) for a person to inspect and replay.
    fn quarantine(
        &self,
        key: &QuarantineKey,
        document: Vec<u8>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
