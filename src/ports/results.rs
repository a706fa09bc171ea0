//! The result store's port: the first object stored under a task's key wins; poison messages
//! are kept for a person.

use std::future::Future;
use std::time::SystemTime;

use crate::domain::ids::{QuarantineKey, ResultKey};
use crate::domain::model::{Page, StoredResult};
use crate::ports::error::AwsError;

/// A page on its way into the store.
#[derive(Debug, Clone, Copy)]
pub struct NewResult<'a> {
    pub key: &'a ResultKey,
    pub page: &'a Page,
    pub sha256: &'a str,
    pub fetched_at: SystemTime,
}

/// The result of a conditional put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Stored,
    /// An object was already under the key; it stays, and the caller adopts it.
    AlreadyThere,
}

/// Where result objects live.
pub trait ResultStore: Send + Sync {
    /// Stores the page only if nothing is stored under the key yet.
    fn put_if_absent(
        &self,
        new: NewResult<'_>,
    ) -> impl Future<Output = Result<Put, AwsError>> + Send;

    /// Describes the object under the key from its metadata, or `None` when there is none.
    fn describe(
        &self,
        key: &ResultKey,
    ) -> impl Future<Output = Result<Option<StoredResult>, AwsError>> + Send;

    /// Keeps a poison message (a JSON document) for a person to inspect and replay.
    fn quarantine(
        &self,
        key: &QuarantineKey,
        document: Vec<u8>,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}
