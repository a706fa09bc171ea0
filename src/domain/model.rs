//! The domain: what a task, its job and run look like to the worker, and how a task ends.

use bytes::Bytes;

use crate::domain::bounds::{ContentType, Reason, UrlText};
use crate::domain::ids::ResultKey;

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

/// The statuses of a task's job and run; `None` means the item is gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parents {
    pub job_status: Option<String>,
    pub run_status: Option<String>,
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
