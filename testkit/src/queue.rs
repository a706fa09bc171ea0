//! Queues in the emulator's SQS: create (with a dead-letter queue), send, receive as Lambda
//! would deliver, drain or take everything.

use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::SqsMessage;
use aws_sdk_sqs::types::{
    MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use conveyor_worker::store::sqs::{SqsQueue, to_record};

use super::{Stack, unique};

pub struct Queue {
    pub url: String,
    pub arn: String,
}

impl Queue {
    /// A standard queue with this visibility timeout (seconds).
    pub async fn create(stack: &Stack, visibility: u32) -> Self {
        Self::create_with(stack, visibility, None).await
    }

    /// A queue that moves a message to `dlq` after `max_receives` receives.
    pub async fn create_with_dlq(
        stack: &Stack,
        visibility: u32,
        dlq: &Queue,
        max_receives: u32,
    ) -> Self {
        let redrive = serde_json::json!({
            "deadLetterTargetArn": dlq.arn,
            "maxReceiveCount": max_receives.to_string(),
        });
        Self::create_with(stack, visibility, Some(redrive.to_string())).await
    }

    /// A FIFO queue (deduplication by id, as the worker's copies name it) with this
    /// visibility timeout, moving a message to `dlq` (FIFO too) after `max_receives`
    /// receives if given.
    pub async fn create_fifo(stack: &Stack, visibility: u32, dlq: Option<(&Queue, u32)>) -> Self {
        let redrive = dlq.map(|(dlq, max_receives)| {
            serde_json::json!({
                "deadLetterTargetArn": dlq.arn,
                "maxReceiveCount": max_receives.to_string(),
            })
            .to_string()
        });
        Self::create_named(
            stack,
            &format!("{}.fifo", unique("tasks")),
            visibility,
            redrive,
        )
        .await
    }

    async fn create_with(stack: &Stack, visibility: u32, redrive: Option<String>) -> Self {
        Self::create_named(stack, &unique("tasks"), visibility, redrive).await
    }

    async fn create_named(
        stack: &Stack,
        name: &str,
        visibility: u32,
        redrive: Option<String>,
    ) -> Self {
        let mut request = stack.sqs.create_queue().queue_name(name).attributes(
            QueueAttributeName::VisibilityTimeout,
            visibility.to_string(),
        );
        if name.ends_with(".fifo") {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        if let Some(redrive) = redrive {
            request = request.attributes(QueueAttributeName::RedrivePolicy, redrive);
        }
        let url = request
            .send()
            .await
            .expect("create a queue")
            .queue_url
            .expect("a queue URL");
        let arn = SqsQueue::new(stack.sqs.clone(), &url)
            .arn()
            .await
            .expect("read the queue ARN")
            .expect("the queue has an ARN");
        Self { url, arn }
    }

    pub async fn send(&self, stack: &Stack, body: &str) -> String {
        stack
            .sqs
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send()
            .await
            .expect("send a message")
            .message_id
            .expect("a message id")
    }

    /// Sends up to ten bodies in one request; their message ids.
    pub async fn send_batch(&self, stack: &Stack, bodies: &[String]) -> Vec<String> {
        let bodies: Vec<_> = bodies.iter().map(|b| (b.clone(), None)).collect();
        self.send_grouped(stack, &bodies).await
    }

    /// Sends up to ten bodies in one request, each with its message group id if any (a fair
    /// queue's tenant, a FIFO queue's group); on a FIFO queue each is a message of its own
    /// (a deduplication id each). Their message ids.
    pub async fn send_grouped(
        &self,
        stack: &Stack,
        bodies: &[(String, Option<String>)],
    ) -> Vec<String> {
        let fifo = self.url.ends_with(".fifo");
        let entries = bodies.iter().enumerate().map(|(i, (body, group))| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .set_message_group_id(group.clone())
                .set_message_deduplication_id(fifo.then(|| unique("sent")))
                .build()
                .expect("id and body are set")
        });
        let out = stack
            .sqs
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .expect("send a batch");
        assert!(out.failed.is_empty(), "every message is sent");
        out.successful.into_iter().map(|s| s.message_id).collect()
    }

    /// One short-polling receive, as the Lambda event source would deliver it.
    pub async fn receive(&self, stack: &Stack) -> Option<SqsMessage> {
        let out = stack
            .sqs
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .expect("receive");
        let message = out.messages?.into_iter().next()?;
        Some(to_record(&message, &self.arn))
    }

    /// Polls until a message is delivered; it and how long that took.
    pub async fn wait_for_redelivery(
        &self,
        stack: &Stack,
        limit: Duration,
    ) -> (SqsMessage, Duration) {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(message) = self.receive(stack).await {
                return (message, started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("not redelivered within {limit:?}");
    }

    /// Messages visible or in flight, by the queue's own count.
    pub async fn depth(&self, stack: &Stack) -> u64 {
        SqsQueue::new(stack.sqs.clone(), &self.url)
            .depth()
            .await
            .expect("read the queue depth")
    }

    /// Receives everything visible, deleting nothing. On a FIFO queue that is at most ten
    /// messages of a group: SQS gives out no more of a group while some are in flight.
    pub async fn drain(&self, stack: &Stack) -> Vec<SqsMessage> {
        self.receive_all(stack, false).await
    }

    /// Receives and deletes everything visible: every message of a FIFO queue too.
    pub async fn take_all(&self, stack: &Stack) -> Vec<SqsMessage> {
        self.receive_all(stack, true).await
    }

    async fn receive_all(&self, stack: &Stack, delete: bool) -> Vec<SqsMessage> {
        let mut all = Vec::new();
        loop {
            let out = stack
                .sqs
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(10)
                .visibility_timeout(600)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .expect("receive");
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() {
                return all;
            }
            if delete {
                self.delete(stack, &messages).await;
            }
            all.extend(messages.iter().map(|m| to_record(m, &self.arn)));
        }
    }

    async fn delete(&self, stack: &Stack, messages: &[aws_sdk_sqs::types::Message]) {
        let messages: Vec<_> = messages.iter().collect();
        SqsQueue::new(stack.sqs.clone(), &self.url)
            .delete(&messages)
            .await
            .expect("delete a batch");
    }
}
