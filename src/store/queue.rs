//! Retry timing: a transiently failed message is held back in SQS before its redelivery, for
//! as long as the site asked (`Retry-After`) or an exponential, fully jittered backoff.

use std::future::Future;
use std::time::Duration;

use aws_sdk_sqs::Client;

use crate::config::Config;
use crate::store::error::StoreError;

/// SQS's longest visibility timeout.
pub const SQS_MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// How long to hold a message back before its next delivery.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The ceiling of the first retry; it doubles with every receive.
    pub base: Duration,
    /// No hold is longer, whatever the site asks (and never longer than 12 hours).
    pub max: Duration,
    /// A number in [0, 1]: `fastrand::f64` in production ("full jitter").
    pub jitter: fn() -> f64,
}

impl From<&Config> for Backoff {
    fn from(config: &Config) -> Self {
        Self {
            base: config.retry_backoff_base,
            max: config.retry_backoff_max,
            jitter: fastrand::f64,
        }
    }
}

impl Backoff {
    /// `Retry-After` when the site sent it, else a random time up to `base * 2^(receives-1)`;
    /// both capped by `max` and SQS's 12 hours.
    pub fn delay(&self, retry_after: Option<Duration>, receive_count: u32) -> Duration {
        let cap = self.max.min(SQS_MAX_VISIBILITY);
        match retry_after {
            Some(asked) => asked.min(cap),
            None => {
                let doublings = receive_count.saturating_sub(1).min(30);
                let ceiling = self.base.saturating_mul(1 << doublings).min(cap);
                ceiling.mul_f64((self.jitter)().clamp(0.0, 1.0))
            }
        }
    }
}

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
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// [`Visibility`] through SQS `ChangeMessageVisibility`.
#[derive(Debug, Clone)]
pub struct SqsVisibility {
    client: Client,
    endpoint: Option<String>,
}

impl SqsVisibility {
    /// `endpoint`: the configured endpoint override, if any (`AWS_ENDPOINT_URL`).
    pub fn new(client: Client, endpoint: Option<String>) -> Self {
        Self { client, endpoint }
    }
}

impl Visibility for SqsVisibility {
    #[tracing::instrument(skip_all, fields(queue = %queue.name, delay_s = delay.as_secs()))]
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(jitter: fn() -> f64) -> Backoff {
        Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(900),
            jitter,
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let b = backoff(|| 0.5);
        assert_eq!(
            b.delay(Some(Duration::from_secs(2)), 1),
            Duration::from_secs(2)
        );
        assert_eq!(
            b.delay(Some(Duration::from_secs(3600)), 1),
            Duration::from_secs(900)
        );
        let unbounded = Backoff {
            max: Duration::from_secs(100_000),
            ..b
        };
        assert_eq!(
            unbounded.delay(Some(Duration::from_secs(90_000)), 1),
            SQS_MAX_VISIBILITY
        );
    }

    #[test]
    fn without_retry_after_the_ceiling_doubles_per_receive_up_to_the_cap() {
        let highest = backoff(|| 1.0);
        let ceilings: Vec<u64> = (1..=10).map(|n| highest.delay(None, n).as_secs()).collect();
        assert_eq!(ceilings, [5, 10, 20, 40, 80, 160, 320, 640, 900, 900]);
        assert_eq!(highest.delay(None, u32::MAX), Duration::from_secs(900));
        assert_eq!(highest.delay(None, 0), Duration::from_secs(5));
    }

    #[test]
    fn full_jitter_spreads_between_zero_and_the_ceiling() {
        assert_eq!(backoff(|| 0.0).delay(None, 4), Duration::ZERO);
        assert_eq!(backoff(|| 0.25).delay(None, 4), Duration::from_secs(10));
        let random = Backoff::from(
            &crate::Config::from_lookup(|name| match name {
                "TABLE_NAME" | "RESULTS_BUCKET" => Some("x".into()),
                _ => None,
            })
            .unwrap(),
        );
        for _ in 0..100 {
            assert!(random.delay(None, 3) <= Duration::from_secs(20));
        }
    }

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
