//! The queue's port: a received message held back before its redelivery, or sent again as a
//! fresh copy; the queue named by its ARN, and SQS's limits on both.

use std::future::Future;
use std::time::Duration;

use crate::ports::error::AwsError;

/// SQS's longest visibility timeout.
pub const SQS_MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// A queue named by an event source ARN: `arn:<partition>:sqs:<region>:<account>:<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRef {
    pub partition: String,
    pub region: String,
    pub account: String,
    pub name: String,
}

impl QueueRef {
    pub fn from_arn(arn: &str) -> Option<Self> {
        let mut parts = arn.splitn(6, ':');
        let (Some("arn"), Some(partition), Some("sqs"), Some(region), Some(account), Some(name)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let fields = [partition, region, account, name];
        if fields.iter().any(|f| f.is_empty()) || name.contains(['/', ':']) {
            return None;
        }
        Some(Self {
            partition: partition.into(),
            region: region.into(),
            account: account.into(),
            name: name.into(),
        })
    }

    /// The queue URL: under `endpoint` when one is configured (a local emulator), else
    /// the partition's regional SQS endpoint.
    pub fn url(&self, endpoint: Option<&str>) -> String {
        let Self {
            partition,
            region,
            account,
            name,
        } = self;
        match endpoint {
            Some(endpoint) => format!("{}/{account}/{name}", endpoint.trim_end_matches('/')),
            None if partition == "aws-cn" => {
                format!("https://sqs.{region}.amazonaws.com.cn/{account}/{name}")
            }
            None => format!("https://sqs.{region}.amazonaws.com/{account}/{name}"),
        }
    }
}

/// Changes how long a received message stays invisible.
pub trait Visibility: Send + Sync {
    fn hold(
        &self,
        queue: &QueueRef,
        receipt_handle: &str,
        delay: Duration,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// Sends a fresh copy of a message, due after `delay` (at most SQS's 15 minutes): its
    /// receive count starts again.
    fn requeue(
        &self,
        queue: &QueueRef,
        body: &str,
        delay: Duration,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}

/// SQS delays a message at most 15 minutes.
pub const SQS_MAX_DELAY: Duration = Duration::from_secs(900);
