//! Errors of the stores, classified from the SDK's own error types before anything is logged.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong talking to AWS, as far as a caller needs to branch or an operator to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AwsFault {
    /// Throttled or over provisioned throughput: back off.
    Throttled,
    /// The service failed (5xx) or sent a response we could not read.
    ServiceFailed,
    /// No answer in time.
    TimedOut,
    /// The request never got there (DNS, connect, TLS, credentials).
    NotSent,
    /// The service refused the request (access denied, missing table or bucket, validation):
    /// a configuration problem that a redelivery may outlast once it is fixed.
    Refused { code: String },
}

impl std::fmt::Display for AwsFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Throttled => f.write_str("throttled"),
            Self::ServiceFailed => f.write_str("service failed"),
            Self::TimedOut => f.write_str("timed out"),
            Self::NotSent => f.write_str("not sent"),
            Self::Refused { code } => write!(f, "refused: {code}"),
        }
    }
}

/// A store call that did not give an answer the worker can act on.
///
/// Every variant asks for a redelivery: AWS faults and concurrent changes pass, and data we
/// cannot read is a bug that must reach the dead-letter queue rather than be dropped.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{operation} {fault}")]
    Aws {
        operation: &'static str,
        fault: AwsFault,
        #[source]
        source: BoxError,
    },
    #[error("unreadable {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("concurrent change: {detail}")]
    Conflict { detail: String },
}

/// Error codes AWS uses for "slow down".
const THROTTLING_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "TransactionInProgressException",
    "SlowDown",
    "BandwidthLimitExceeded",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
];

impl StoreError {
    /// Classifies an SDK error by its variant and service error code, keeping it as the source.
    pub fn from_sdk<E>(operation: &'static str, err: SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let fault = match &err {
            SdkError::TimeoutError(_) => AwsFault::TimedOut,
            SdkError::DispatchFailure(d) if d.is_timeout() => AwsFault::TimedOut,
            SdkError::DispatchFailure(_) | SdkError::ConstructionFailure(_) => AwsFault::NotSent,
            SdkError::ServiceError(ctx) => {
                let code = ctx.err().code();
                let status = ctx.raw().status();
                if status.as_u16() == 429 || code.is_some_and(|c| THROTTLING_CODES.contains(&c)) {
                    AwsFault::Throttled
                } else if status.is_server_error() {
                    AwsFault::ServiceFailed
                } else {
                    let code = code.unwrap_or("unknown").to_owned();
                    AwsFault::Refused { code }
                }
            }
            _ => AwsFault::ServiceFailed,
        };
        Self::Aws {
            operation,
            fault,
            source: Box::new(err),
        }
    }

    /// The AWS fault behind this error, if it came from AWS.
    pub fn aws_fault(&self) -> Option<&AwsFault> {
        match self {
            Self::Aws { fault, .. } => Some(fault),
            Self::Corrupt { .. } | Self::Conflict { .. } => None,
        }
    }
}

/// The service error code of an SDK error, if the service answered with one.
pub(crate) fn service_code<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    match err {
        SdkError::ServiceError(ctx) => ctx.err().code(),
        _ => None,
    }
}
