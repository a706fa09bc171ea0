//! The ports' error type, for a store call that gave no usable answer. It names what went
//! wrong in as much detail as a caller branches on (throttled, a conflict, invalid, ...), or
//! the stored data it could not read. The adapters sort the SDK's errors into it
//! (`store::error`), so no caller sees an SDK type.

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong with a request to a store, as far as a caller needs to branch or an
/// operator to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreFault {
    /// Throttled or over provisioned throughput: back off.
    Throttled,
    /// The service failed (5xx) or sent a response we could not read.
    ServiceFailed,
    /// No answer in time.
    TimedOut,
    /// The request never got there (DNS, connect, TLS, credentials).
    NotSent,
    /// Another request was changing the same item or object at that moment, such as a
    /// DynamoDB transaction in flight, or S3's 409 to racing conditional writes. Try again
    /// shortly.
    Conflict,
    /// The service refused the request itself as invalid (too large, malformed). Sending
    /// the same request again can never succeed.
    Invalid { code: String },
    /// The service refused the request (access denied, missing table or bucket). This is a
    /// configuration problem. A redelivery may succeed once it is fixed.
    Refused { code: String },
}

impl StoreFault {
    /// AWS pushed back or did not answer (throttled, failed, timed out, not sent). Worth
    /// another try once the load has eased, but not at once.
    pub fn is_push_back(&self) -> bool {
        matches!(
            self,
            Self::Throttled | Self::ServiceFailed | Self::TimedOut | Self::NotSent
        )
    }
}

impl std::fmt::Display for StoreFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Throttled => f.write_str("throttled"),
            Self::ServiceFailed => f.write_str("service failed"),
            Self::TimedOut => f.write_str("timed out"),
            Self::NotSent => f.write_str("not sent"),
            Self::Conflict => f.write_str("conflicted with a concurrent change"),
            Self::Invalid { code } => write!(f, "refused as invalid: {code}"),
            Self::Refused { code } => write!(f, "refused: {code}"),
        }
    }
}

/// A store call that did not give an answer the worker can act on.
///
/// Every variant asks for a redelivery, unless the worker can write something else in its
/// place ([`StoreError::is_invalid`]). AWS faults and concurrent changes pass. Data we cannot
/// read is a bug, and must reach the dead-letter queue rather than be dropped.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{operation} {fault}")]
    Failed {
        operation: &'static str,
        fault: StoreFault,
        #[source]
        source: BoxError,
    },
    #[error("unreadable {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// What the worker read changed before its next request: an object gone between two
    /// requests, or counters that kept changing. Trying again shortly may get past it. When
    /// AWS itself refuses a request that met a concurrent one, that is
    /// [`StoreFault::Conflict`] instead.
    #[error("concurrent change: {detail}")]
    Changed { detail: String },
    /// The stored state forbids what was asked (an operator's re-queue of a cancelled run).
    #[error("refused: {detail}")]
    NotAllowed { detail: String },
}

impl StoreError {
    /// A failed request whose fault the caller classified itself: a cancelled transaction,
    /// by its cancellation reasons, or keys that a batch read left unprocessed.
    pub fn failed(operation: &'static str, fault: StoreFault, source: impl Into<BoxError>) -> Self {
        Self::Failed {
            operation,
            fault,
            source: source.into(),
        }
    }

    /// The fault behind this error, if a request failed.
    pub fn fault(&self) -> Option<&StoreFault> {
        match self {
            Self::Failed { fault, .. } => Some(fault),
            Self::Corrupt { .. } | Self::Changed { .. } | Self::NotAllowed { .. } => None,
        }
    }

    /// A concurrent change was in the way: worth trying again shortly, within the invocation.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Changed { .. }) || self.fault() == Some(&StoreFault::Conflict)
    }

    /// AWS refused the request as invalid: the same request can never succeed.
    pub fn is_invalid(&self) -> bool {
        matches!(self.fault(), Some(StoreFault::Invalid { .. }))
    }
}
