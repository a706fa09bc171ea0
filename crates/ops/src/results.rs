//! `conveyor-ops results`: what a run's tasks ended as. Each successful task's stored object
//! is checked against the task's record: its metadata, and, when downloaded, its bytes
//! against the record's SHA-256. Each failed task says why it failed.

use std::path::{Path, PathBuf};

use futures_util::{StreamExt, TryStreamExt, stream};
use sha2::{Digest, Sha256};

use conveyor_worker::domain::ids::ResultKey;
use conveyor_worker::domain::ids::RunRef;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::ports::results::ResultStore;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::attributes::{Item, number, string};
use conveyor_worker::store::s3::S3ResultStore;

/// One task as it ended (or not yet).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskResult {
    pub task_id: String,
    pub status: String,
    pub url: Option<String>,
    pub result_key: Option<String>,
    pub sha256: Option<String>,
    pub size: Option<u64>,
    pub http_status: Option<u16>,
    pub content_type: Option<String>,
    /// Carried forward from the run it refreshes: the site said the page had not changed.
    pub not_modified: bool,
    /// The application shell rule the stored page met (`shell_rule`), if it is one.
    pub shell: Option<String>,
    /// The stored page was rendered in a browser (`rendered`).
    pub rendered: bool,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub error: Option<String>,
    /// Where the object was written, with `--out`.
    pub file: Option<PathBuf>,
    pub check: Check,
}

/// What checking a successful task's object against its record found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The object is there and matches the record.
    Verified,
    /// The object is missing, or differs from the record. Says how.
    Mismatch(String),
    /// Not a successful task: nothing to check.
    NotApplicable,
}

/// Which tasks, and whether to download their objects.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub failed_only: bool,
    /// Download each object here, named by its task id, checking its bytes.
    pub out: Option<PathBuf>,
}

/// How many objects are checked (or downloaded) at once.
const AT_ONCE: usize = 16;

/// Why the results could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A downloaded object could not be written here.
    #[error("could not write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Every task of the run (or the failed ones), in task order, each successful one checked.
pub async fn results(
    tasks: &DynamoTaskStore,
    objects: &S3ResultStore,
    run: RunRef<'_>,
    options: &Options,
) -> Result<Vec<TaskResult>, ResultsError> {
    let (job, run_id) = (run.job_id, run.run_id);
    objects.check_bucket().await?;
    let mut items = tasks.run_tasks(job, run_id).await?;
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let wanted = items
        .into_iter()
        .map(|(task, item)| of_item(task, &item))
        .filter(|t| !options.failed_only || t.status == "failed");
    stream::iter(wanted.map(|task| check(objects, task, options.out.as_deref())))
        .buffered(AT_ONCE)
        .try_collect()
        .await
}

fn of_item(task_id: String, item: &Item) -> TaskResult {
    let text = |name| string(item, name).map(str::to_owned);
    TaskResult {
        task_id,
        status: text("status").unwrap_or_default(),
        url: text("url"),
        result_key: text("result_key"),
        sha256: text("result_sha256"),
        size: number(item, "result_size"),
        http_status: number(item, "http_status"),
        content_type: text("content_type"),
        not_modified: item
            .get("not_modified")
            .is_some_and(|v| v.as_bool() == Ok(&true)),
        shell: text("shell_rule"),
        rendered: item
            .get("rendered")
            .is_some_and(|v| v.as_bool() == Ok(&true)),
        etag: text("etag"),
        last_modified: text("last_modified"),
        error: text("error"),
        file: None,
        check: Check::NotApplicable,
    }
}

/// A successful task's object against its record: metadata, or with `out` the bytes.
async fn check(
    objects: &S3ResultStore,
    mut task: TaskResult,
    out: Option<&Path>,
) -> Result<TaskResult, ResultsError> {
    let (Some(key), "successful") = (task.result_key.clone(), task.status.as_str()) else {
        return Ok(task);
    };
    let expected = (task.sha256.clone().unwrap_or_default(), task.size);
    task.check = match out {
        None => match objects
            .describe(&ResultKey::from_stored(key.clone()))
            .await?
        {
            None => Check::Mismatch(format!("no object at {key}")),
            Some(stored) if (stored.sha256.clone(), Some(stored.size)) == expected => {
                Check::Verified
            }
            Some(stored) => Check::Mismatch(format!(
                "the object says sha256 {} and {} bytes",
                stored.sha256, stored.size
            )),
        },
        Some(dir) => {
            let Some(bytes) = objects.read_if_there(&key).await? else {
                task.check = Check::Mismatch(format!("no object at {key}"));
                return Ok(task);
            };
            let file = dir.join(&task.task_id);
            std::fs::write(&file, &bytes).map_err(|source| ResultsError::Write {
                path: file.clone(),
                source,
            })?;
            task.file = Some(file);
            let sha256 = hex::encode(Sha256::digest(&bytes));
            if sha256 == expected.0 {
                Check::Verified
            } else {
                Check::Mismatch(format!("the bytes hash to {sha256}"))
            }
        }
    };
    Ok(task)
}
