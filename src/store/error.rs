//! Errors of the stores, classified from the SDK's own error types before anything is logged.

use aws_runtime::retries::classifiers::{THROTTLING_ERRORS, TRANSIENT_ERRORS};
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use crate::ports::error::{AwsError, AwsFault};

/// Codes of a request that met a concurrent change of the same item or object.
const CONFLICT_CODES: &[&str] = &[
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
    "ConditionalRequestConflict",
    "OperationAborted",
];

/// Codes of a request refused for what it is (size, shape), not for who sent it.
const INVALID_CODES: &[&str] = &[
    "ValidationException",
    "ItemCollectionSizeLimitExceededException",
    "SerializationException",
    "InvalidArgument",
    "InvalidRequest",
    "MetadataTooLarge",
    "RequestHeaderSectionTooLarge",
    "EntityTooLarge",
    "KeyTooLongError",
];

impl AwsError {
    /// Classifies an SDK error by its variant and service error code, keeping it as the source.
    pub fn from_sdk<E>(operation: &'static str, err: SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let fault = match &err {
            SdkError::TimeoutError(_) => AwsFault::TimedOut,
            SdkError::DispatchFailure(d) if d.is_timeout() => AwsFault::TimedOut,
            SdkError::DispatchFailure(_) | SdkError::ConstructionFailure(_) => AwsFault::NotSent,
            SdkError::ServiceError(ctx) => classify(ctx.raw().status().as_u16(), ctx.err().code()),
            _ => AwsFault::ServiceFailed,
        };
        Self::Aws {
            operation,
            fault,
            source: Box::new(err),
        }
    }
}

/// The fault of a cancelled DynamoDB transaction, by its items' cancellation reasons (in
/// item order; `None` for an item that was fine), when one of them says more than "a
/// condition failed".
pub fn cancellation_fault(codes: &[&str]) -> Option<AwsFault> {
    let any = |code: &str| codes.contains(&code);
    if any("TransactionConflict") {
        Some(AwsFault::Conflict)
    } else if any("ValidationError") {
        Some(AwsFault::Invalid {
            code: "ValidationError".into(),
        })
    } else if any("ThrottlingError") || any("ProvisionedThroughputExceeded") {
        Some(AwsFault::Throttled)
    } else {
        None
    }
}

/// An AWS service error by HTTP status and error code. Throttling and transient codes are
/// the SDK's own lists (`aws-runtime`), so they stay what the SDK's retries use.
pub fn classify(status: u16, code: Option<&str>) -> AwsFault {
    let is = |codes: &[&str]| code.is_some_and(|c| codes.contains(&c));
    if status == 429 || is(THROTTLING_ERRORS) {
        AwsFault::Throttled
    } else if is(TRANSIENT_ERRORS) {
        AwsFault::TimedOut
    } else if is(CONFLICT_CODES) {
        AwsFault::Conflict
    } else if (500..600).contains(&status) {
        AwsFault::ServiceFailed
    } else if is(INVALID_CODES) {
        let code = code.unwrap_or_default().to_owned();
        AwsFault::Invalid { code }
    } else {
        let code = code.unwrap_or("unknown").to_owned();
        AwsFault::Refused { code }
    }
}

/// The service error code of an SDK error, if the service answered with one.
pub(crate) fn service_code<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    match err {
        SdkError::ServiceError(ctx) => ctx.err().code(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_the_sdk_retries_as_throttling_is_throttled_here() {
        for code in THROTTLING_ERRORS {
            assert_eq!(classify(400, Some(code)), AwsFault::Throttled, "{code}");
        }
        assert_eq!(
            classify(400, Some("LimitExceededException")),
            AwsFault::Throttled
        );
        for code in TRANSIENT_ERRORS {
            assert_eq!(classify(400, Some(code)), AwsFault::TimedOut, "{code}");
        }
    }

    #[test]
    fn concurrent_changes_invalid_requests_and_refusals_are_told_apart() {
        let table = [
            (400, "TransactionConflictException", AwsFault::Conflict),
            (409, "ConditionalRequestConflict", AwsFault::Conflict),
            (
                400,
                "ValidationException",
                AwsFault::Invalid {
                    code: "ValidationException".into(),
                },
            ),
            (
                400,
                "RequestHeaderSectionTooLarge",
                AwsFault::Invalid {
                    code: "RequestHeaderSectionTooLarge".into(),
                },
            ),
            (
                404,
                "NoSuchBucket",
                AwsFault::Refused {
                    code: "NoSuchBucket".into(),
                },
            ),
            (
                400,
                "AccessDeniedException",
                AwsFault::Refused {
                    code: "AccessDeniedException".into(),
                },
            ),
            (503, "ServiceUnavailable", AwsFault::ServiceFailed),
            (429, "Anything", AwsFault::Throttled),
        ];
        for (status, code, expected) in table {
            assert_eq!(classify(status, Some(code)), expected, "{status} {code}");
        }
    }
}
