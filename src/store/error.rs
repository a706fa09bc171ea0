//! Errors of the stores, classified from the SDK's own error types before anything is logged.

use aws_runtime::retries::classifiers::{THROTTLING_ERRORS, TRANSIENT_ERRORS};
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use crate::ports::error::{StoreError, StoreFault};
use crate::trace;

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

impl StoreError {
    /// Classifies an SDK error by its variant and service error code, keeping it as the source.
    pub fn from_sdk<E>(operation: &'static str, err: SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let fault = match &err {
            SdkError::TimeoutError(_) => StoreFault::TimedOut,
            SdkError::DispatchFailure(d) if d.is_timeout() => StoreFault::TimedOut,
            SdkError::DispatchFailure(_) | SdkError::ConstructionFailure(_) => StoreFault::NotSent,
            SdkError::ServiceError(ctx) => classify(ctx.raw().status().as_u16(), ctx.err().code()),
            _ => StoreFault::ServiceFailed,
        };
        // Within the adapter's span of the request that met the error.
        trace::failed("store_error", "retry");
        trace::note("error.operation", operation);
        Self::Failed {
            operation,
            fault,
            source: Box::new(err),
        }
    }
}

/// The fault of a cancelled DynamoDB transaction, from its items' cancellation reason codes.
/// The codes are in item order, with `None` for an item that was fine. A fault is returned
/// only when one of them says more than "a condition failed".
pub fn cancellation_fault(codes: &[&str]) -> Option<StoreFault> {
    let any = |code: &str| codes.contains(&code);
    if any("TransactionConflict") {
        Some(StoreFault::Conflict)
    } else if any("ValidationError") {
        Some(StoreFault::Invalid {
            code: "ValidationError".into(),
        })
    } else if any("ThrottlingError") || any("ProvisionedThroughputExceeded") {
        Some(StoreFault::Throttled)
    } else {
        None
    }
}

/// An AWS service error by HTTP status and error code. Throttling and transient codes are
/// the SDK's own lists (`aws-runtime`), so they stay what the SDK's retries use.
pub fn classify(status: u16, code: Option<&str>) -> StoreFault {
    let is = |codes: &[&str]| code.is_some_and(|c| codes.contains(&c));
    if status == 429 || is(THROTTLING_ERRORS) {
        StoreFault::Throttled
    } else if is(TRANSIENT_ERRORS) {
        StoreFault::TimedOut
    } else if is(CONFLICT_CODES) {
        StoreFault::Conflict
    } else if (500..600).contains(&status) {
        StoreFault::ServiceFailed
    } else if is(INVALID_CODES) {
        let code = code.unwrap_or_default().to_owned();
        StoreFault::Invalid { code }
    } else {
        let code = code.unwrap_or("unknown").to_owned();
        StoreFault::Refused { code }
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
            assert_eq!(classify(400, Some(code)), StoreFault::Throttled, "{code}");
        }
        assert_eq!(
            classify(400, Some("LimitExceededException")),
            StoreFault::Throttled
        );
        for code in TRANSIENT_ERRORS {
            assert_eq!(classify(400, Some(code)), StoreFault::TimedOut, "{code}");
        }
    }

    #[test]
    fn concurrent_changes_invalid_requests_and_refusals_are_told_apart() {
        let table = [
            (400, "TransactionConflictException", StoreFault::Conflict),
            (409, "ConditionalRequestConflict", StoreFault::Conflict),
            (
                400,
                "ValidationException",
                StoreFault::Invalid {
                    code: "ValidationException".into(),
                },
            ),
            (
                400,
                "RequestHeaderSectionTooLarge",
                StoreFault::Invalid {
                    code: "RequestHeaderSectionTooLarge".into(),
                },
            ),
            (
                404,
                "NoSuchBucket",
                StoreFault::Refused {
                    code: "NoSuchBucket".into(),
                },
            ),
            (
                400,
                "AccessDeniedException",
                StoreFault::Refused {
                    code: "AccessDeniedException".into(),
                },
            ),
            (503, "ServiceUnavailable", StoreFault::ServiceFailed),
            (429, "Anything", StoreFault::Throttled),
        ];
        for (status, code, expected) in table {
            assert_eq!(classify(status, Some(code)), expected, "{status} {code}");
        }
    }
}
