//! The queue port: hold a received message back before its redelivery, or send it again as
//! a fresh copy. Also the queue named by its ARN, and SQS's limits on both.

use std::future::Future;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;

use crate::ports::error::StoreError;

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

    /// Whether it is a FIFO queue (its name ends in `.fifo`, as SQS requires).
    pub fn is_fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }

    /// The queue URL: under `endpoint` when one is configured (a local emulator). Otherwise
    /// under the partition's regional SQS endpoint.
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
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Sends a fresh copy of a message, delivered after its delay (at most SQS's 15
    /// minutes). The copy's receive count starts again from zero.
    fn requeue(
        &self,
        queue: &QueueRef,
        copy: &MessageCopy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A fresh copy of a received message: its body, its delay, and what SQS keeps besides the
/// body, as the producer sent it. That is the message group (a fair queue's tenant), the
/// message attributes and the trace (`AWSTraceHeader`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageCopy {
    pub body: String,
    pub delay: Duration,
    pub group: Option<String>,
    /// A FIFO queue's deduplication id for the copy.
    pub deduplication: Option<String>,
    pub attributes: Vec<Attribute>,
    /// The trace the copy carries on (`crate::trace::for_copy`), sent as its
    /// `AWSTraceHeader` system attribute.
    pub trace_header: Option<String>,
}

/// A message attribute: its name, data type (`String`, `Number`, `Binary`, with an optional
/// custom suffix) and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    pub name: String,
    pub data_type: String,
    pub value: AttributeValue,
}

impl Attribute {
    /// The message attributes of a received record, as a copy of it sends them again.
    pub fn all_of(record: &SqsMessage) -> Vec<Attribute> {
        let each = record
            .message_attributes
            .iter()
            .filter_map(|(name, value)| {
                let value_of = match (&value.string_value, &value.binary_value) {
                    (Some(text), _) => AttributeValue::Text(text.clone()),
                    (None, Some(bytes)) => AttributeValue::Bytes(bytes.0.clone()),
                    (None, None) => return None,
                };
                Some(Attribute {
                    name: name.clone(),
                    data_type: value.data_type.clone()?,
                    value: value_of,
                })
            });
        each.collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    Text(String),
    Bytes(Vec<u8>),
}

/// SQS delays a message at most 15 minutes.
pub const SQS_MAX_DELAY: Duration = Duration::from_secs(900);
