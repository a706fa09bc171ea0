//! Converge: every delivery of a task lands on one S3 key, and the task record always
//! describes the object that is actually stored there.

use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::ids::{ResultKey, TaskRef};
use crate::model::{Failure, Page, StoredResult, Terminal};
use crate::result_store::{NewResult, Put, ResultStore};
use crate::task_store::{Finish, TaskStore};

/// What the terminal write recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converged {
    /// The task is successful; `adopted` when the stored object came from another delivery.
    Succeeded { adopted: bool },
    /// The task is failed with this reason.
    Failed { reason: String },
    /// Another delivery had already made the terminal write.
    LostRace,
}

/// Stores the page (the first stored object wins; a later writer adopts it) and finishes the
/// task as successful, describing the object that is stored.
#[tracing::instrument(skip_all, fields(%key))]
pub async fn succeed<T: TaskStore, R: ResultStore>(
    tasks: &T,
    results: &R,
    task: &TaskRef,
    key: &ResultKey,
    page: &Page,
) -> Result<Converged, StoreError> {
    let sha256 = hex::encode(Sha256::digest(&page.body));
    let new = NewResult {
        key,
        page,
        sha256: &sha256,
        fetched_at: SystemTime::now(),
    };
    let (stored, adopted) = match results.put_if_absent(new).await? {
        Put::Stored => (described(key, page, sha256), false),
        Put::AlreadyThere => (adopt(results, key).await?, true),
    };
    finish(
        tasks,
        task,
        Terminal::Succeeded(stored),
        Converged::Succeeded { adopted },
    )
    .await
}

/// Finishes the task as failed, unless an earlier delivery already stored its page: a
/// stored result always wins over a later failure.
#[tracing::instrument(skip_all, fields(%key))]
pub async fn fail<T: TaskStore, R: ResultStore>(
    tasks: &T,
    results: &R,
    task: &TaskRef,
    key: &ResultKey,
    failure: Failure,
) -> Result<Converged, StoreError> {
    match results.describe(key).await? {
        Some(stored) => {
            let adopted = Converged::Succeeded { adopted: true };
            finish(tasks, task, Terminal::Succeeded(stored), adopted).await
        }
        None => {
            let failed = Converged::Failed {
                reason: failure.reason.clone(),
            };
            finish(tasks, task, Terminal::Failed(failure), failed).await
        }
    }
}

async fn finish<T: TaskStore>(
    tasks: &T,
    task: &TaskRef,
    terminal: Terminal,
    written: Converged,
) -> Result<Converged, StoreError> {
    Ok(
        match tasks.finish(task, &terminal, SystemTime::now()).await? {
            Finish::Written { .. } => written,
            Finish::LostRace => Converged::LostRace,
        },
    )
}

async fn adopt<R: ResultStore>(results: &R, key: &ResultKey) -> Result<StoredResult, StoreError> {
    results
        .describe(key)
        .await?
        .ok_or_else(|| StoreError::Conflict {
            detail: format!("{key} was there for the put but gone for the read"),
        })
}

fn described(key: &ResultKey, page: &Page, sha256: String) -> StoredResult {
    StoredResult {
        key: key.clone(),
        sha256,
        size: page.body.len() as u64,
        http_status: page.http_status,
        content_type: page.content_type.clone(),
        final_url: page.final_url.clone(),
    }
}
