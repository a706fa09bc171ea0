//! The queue's SQS adapter (`ports::queue::Visibility`): `ChangeMessageVisibility` and fresh
//! copies. Also what operators do with a queue, as Lambda's event source mapping would:
//! receive, delete and send batches, and read its depth and ARN.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageAttributeValue, MessageSystemAttributeName, MessageSystemAttributeNameForSends,
    MessageSystemAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry,
};

use crate::domain::ids::TaskRef;
use crate::domain::message;
use crate::ports::error::StoreError;
use crate::ports::queue::{
    Attribute, AttributeValue, MessageCopy, QueueRef, SQS_MAX_DELAY, SQS_MAX_VISIBILITY, Visibility,
};
use crate::store::lazy::Lazy;
use aws_sdk_sqs::primitives::Blob;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

/// [`Visibility`] through SQS `ChangeMessageVisibility`.
#[derive(Debug, Clone)]
pub struct SqsVisibility {
    client: Lazy<Client>,
    endpoint: Lazy<Option<String>>,
}

impl SqsVisibility {
    /// `endpoint`: the configured endpoint override, if any (`AWS_ENDPOINT_URL`).
    pub fn new(client: impl Into<Lazy<Client>>, endpoint: impl Into<Lazy<Option<String>>>) -> Self {
        Self {
            client: client.into(),
            endpoint: endpoint.into(),
        }
    }
}

impl Visibility for SqsVisibility {
    #[tracing::instrument(
        name = "hold",
        skip_all,
        fields(queue = %queue.name, delay_s = delay.as_secs())
    )]
    async fn hold(
        &self,
        queue: &QueueRef,
        receipt_handle: &str,
        delay: Duration,
    ) -> Result<(), StoreError> {
        // Whole seconds, rounded up, within SQS's 0..=43200.
        let seconds = delay.min(SQS_MAX_VISIBILITY).as_secs_f64().ceil() as i32;
        self.client
            .change_message_visibility()
            .queue_url(queue.url(self.endpoint.as_deref()))
            .receipt_handle(receipt_handle)
            .visibility_timeout(seconds)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("ChangeMessageVisibility", e))?;
        Ok(())
    }

    #[tracing::instrument(
        name = "copy",
        skip_all,
        fields(queue = %queue.name, delay_s = copy.delay.as_secs())
    )]
    async fn requeue(&self, queue: &QueueRef, copy: &MessageCopy) -> Result<(), StoreError> {
        send_copy(&self.client, &queue.url(self.endpoint.as_deref()), copy).await
    }
}

/// Sends `copy` to the queue at `url`, with its group, deduplication id and attributes.
async fn send_copy(client: &Client, url: &str, copy: &MessageCopy) -> Result<(), StoreError> {
    // A FIFO queue takes no per-message delay. SQS refuses even 0 as a parameter.
    let seconds = match copy.deduplication {
        Some(_) => None,
        None => Some(copy.delay.min(SQS_MAX_DELAY).as_secs_f64().ceil() as i32),
    };
    let attributes = copy
        .attributes
        .iter()
        .map(|a| (a.name.clone(), attribute(a)));
    client
        .send_message()
        .queue_url(url)
        .message_body(&copy.body)
        .set_delay_seconds(seconds)
        .set_message_group_id(copy.group.clone())
        .set_message_deduplication_id(copy.deduplication.clone())
        .set_message_attributes(
            Some(attributes.collect()).filter(|a: &HashMap<_, _>| !a.is_empty()),
        )
        .set_message_system_attributes(copy.trace_header.as_deref().map(trace_attribute))
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("SendMessage", e))?;
    Ok(())
}

/// The `AWSTraceHeader` system attribute, SQS's only one a sender sets.
fn trace_attribute(
    header: &str,
) -> HashMap<MessageSystemAttributeNameForSends, MessageSystemAttributeValue> {
    let value = MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header)
        .build()
        // Cannot fail: the data type, the one required field, is set.
        .expect("a data type is set");
    HashMap::from([(MessageSystemAttributeNameForSends::AwsTraceHeader, value)])
}

/// A copy's message attribute as SQS takes it.
fn attribute(attribute: &Attribute) -> MessageAttributeValue {
    let value = MessageAttributeValue::builder().data_type(&attribute.data_type);
    let value = match &attribute.value {
        AttributeValue::Text(text) => value.string_value(text),
        AttributeValue::Bytes(bytes) => value.binary_value(Blob::new(bytes.clone())),
    };
    value
        .build()
        .expect("the data type, the required field, is set")
}

/// A queue as operators and the local event source mapping use it.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
}

/// The approximate counts that make up a queue's depth: visible, in flight, and delayed.
/// Delayed counts because a record whose host had no room is sent again with a delay.
const DEPTH: [QueueAttributeName; 3] = [
    QueueAttributeName::ApproximateNumberOfMessages,
    QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
    QueueAttributeName::ApproximateNumberOfMessagesDelayed,
];

impl SqsQueue {
    pub fn new(client: Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Messages visible, in flight or delayed, by the queue's own approximate counts.
    pub async fn depth(&self) -> Result<u64, StoreError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .set_attribute_names(Some(DEPTH.to_vec()))
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetQueueAttributes", e))?;
        let attributes = out.attributes.unwrap_or_default();
        Ok(DEPTH
            .iter()
            .filter_map(|name| attributes.get(name)?.parse::<u64>().ok())
            .sum())
    }

    /// The queue's ARN, which Lambda puts in every record as `eventSourceARN`.
    pub async fn arn(&self) -> Result<Option<String>, StoreError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetQueueAttributes", e))?;
        Ok(out
            .attributes
            .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn)))
    }

    /// The queue's dead-letter queue, by its redrive policy, if it has one.
    pub async fn dead_letter_queue(&self) -> Result<Option<SqsQueue>, StoreError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetQueueAttributes", e))?;
        let policy = out
            .attributes
            .and_then(|mut a| a.remove(&QueueAttributeName::RedrivePolicy));
        let target = policy
            .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
            .and_then(|p| {
                p["deadLetterTargetArn"]
                    .as_str()
                    .and_then(QueueRef::from_arn)
            });
        let Some(target) = target else {
            return Ok(None);
        };
        let out = self
            .client
            .get_queue_url()
            .queue_name(&target.name)
            .queue_owner_aws_account_id(&target.account)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetQueueUrl", e))?;
        Ok(out
            .queue_url
            .map(|url| SqsQueue::new(self.client.clone(), url)))
    }

    /// Up to `max` messages, waiting up to `wait_seconds` for the first.
    pub async fn receive(&self, max: i32, wait_seconds: i32) -> Result<Vec<Message>, StoreError> {
        self.receive_hidden(max, wait_seconds, None).await
    }

    /// As [`SqsQueue::receive`], with each message hidden for `hidden_seconds`, or else for
    /// the queue's visibility timeout.
    pub async fn receive_hidden(
        &self,
        max: i32,
        wait_seconds: i32,
        hidden_seconds: Option<i32>,
    ) -> Result<Vec<Message>, StoreError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max)
            .wait_time_seconds(wait_seconds)
            .set_visibility_timeout(hidden_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("ReceiveMessage", e))?;
        Ok(out.messages.unwrap_or_default())
    }

    /// Deletes these received messages (at most 10).
    pub async fn delete(&self, messages: &[&Message]) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let entries = messages.iter().enumerate().map(|(i, m)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .build()
                .expect("id and receipt handle, the required fields, are set")
        });
        self.client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("DeleteMessageBatch", e))?;
        Ok(())
    }

    /// Makes these received messages visible again at once (at most 10).
    pub async fn release(&self, messages: &[&Message]) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let entries = messages.iter().enumerate().map(|(i, m)| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .visibility_timeout(0)
                .build()
                .expect("id and receipt handle, the required fields, are set")
        });
        self.client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("ChangeMessageVisibilityBatch", e))?;
        Ok(())
    }

    /// Sends one message body, with `attributes` (name, string value) if any, delivered
    /// after `delay` (at most SQS's 15 minutes).
    pub async fn send_with(
        &self,
        body: &str,
        attributes: &[(&str, &str)],
        delay: std::time::Duration,
    ) -> Result<(), StoreError> {
        let delay = i32::try_from(delay.as_secs().min(900)).unwrap_or(900);
        let mut request = self
            .client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .delay_seconds(delay);
        for (name, value) in attributes {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(*value)
                .build()
                .expect("the data type, the required field, is set");
            request = request.message_attributes(*name, value);
        }
        request
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("SendMessage", e))?;
        Ok(())
    }

    /// Whether this is a FIFO queue (its name ends in `.fifo`).
    pub fn is_fifo(&self) -> bool {
        self.url.ends_with(".fifo")
    }

    /// Sends `copy`, with its group, deduplication id and message attributes.
    pub async fn send_copy(&self, copy: &MessageCopy) -> Result<(), StoreError> {
        send_copy(&self.client, &self.url, copy).await
    }

    /// Sends one message per task (at most 10). Returns the tasks whose message SQS did not
    /// take. On a FIFO queue, each task gets a message group of its own, so no task waits
    /// behind another's retries. Each message also gets a deduplication id of its own.
    pub async fn send_tasks(&self, tasks: &[TaskRef]) -> Result<Vec<TaskRef>, StoreError> {
        let sent_at = crate::domain::time::epoch_millis(std::time::SystemTime::now());
        let entries = tasks.iter().enumerate().map(|(i, task)| {
            let fifo = self.is_fifo().then(|| fifo_names(task, sent_at));
            let (group, deduplication) = fifo.unzip();
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(message::body(task))
                .set_message_group_id(group)
                .set_message_deduplication_id(deduplication)
                .build()
                .expect("id and body, the required fields, are set")
        });
        let out = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("SendMessageBatch", e))?;
        let failed: HashSet<&str> = out.failed().iter().map(|f| f.id()).collect();
        Ok(tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| failed.contains(i.to_string().as_str()))
            .map(|(_, task)| task.clone())
            .collect())
    }
}

/// A task's message group on a FIFO queue, and the deduplication id of its message sent at
/// `sent_at`. The group is a digest of the task's key, so it fits SQS's 128 characters.
fn fifo_names(task: &TaskRef, sent_at: u128) -> (String, String) {
    use sha2::{Digest, Sha256};
    let key = format!("{}/{}/{}", task.job_id, task.run_id, task.task_id);
    let group = hex::encode(Sha256::digest(key.as_bytes()));
    let deduplication = hex::encode(Sha256::digest(format!("{key}#{sent_at}").as_bytes()));
    (group, deduplication)
}

/// An SQS message as Lambda's event source mapping hands it to the function.
pub fn to_record(message: &Message, queue_arn: &str) -> SqsMessage {
    let attributes: serde_json::Map<String, serde_json::Value> = message
        .attributes()
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.as_str().to_owned(), value.clone().into()))
        .collect();
    let message_attributes: serde_json::Map<String, serde_json::Value> = message
        .message_attributes()
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| {
            let mut attribute = serde_json::json!({ "dataType": value.data_type() });
            match (value.string_value(), value.binary_value()) {
                (Some(text), _) => attribute["stringValue"] = text.into(),
                (None, Some(bytes)) => {
                    attribute["binaryValue"] = BASE64.encode(bytes.as_ref()).into();
                }
                (None, None) => return None,
            }
            Some((name.clone(), attribute))
        })
        .collect();
    let region = queue_arn.split(':').nth(3).unwrap_or_default();
    let json = serde_json::json!({
        "messageId": message.message_id(),
        "receiptHandle": message.receipt_handle(),
        "body": message.body(),
        "md5OfBody": message.md5_of_body(),
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    });
    // Every field is a string or a map of strings, as SqsMessage expects.
    serde_json::from_value(json).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_urls_come_from_the_event_source_arn() {
        let q = QueueRef::from_arn("arn:aws:sqs:eu-west-1:123456789012:conveyor-tasks").unwrap();
        assert_eq!(
            q.url(None),
            "https://sqs.eu-west-1.amazonaws.com/123456789012/conveyor-tasks"
        );
        assert_eq!(
            q.url(Some("http://127.0.0.1:5000/")),
            "http://127.0.0.1:5000/123456789012/conveyor-tasks"
        );
        let cn = QueueRef::from_arn("arn:aws-cn:sqs:cn-north-1:123456789012:q").unwrap();
        assert_eq!(
            cn.url(None),
            "https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q"
        );
        for bad in [
            "",
            "arn:aws:sns:us-east-1:1:t",
            "arn:aws:sqs:us-east-1:1",
            "arn:aws:sqs::1:q",
            "x",
        ] {
            assert_eq!(QueueRef::from_arn(bad), None, "{bad}");
        }
    }
}
