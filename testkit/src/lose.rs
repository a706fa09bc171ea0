//! An SDK interceptor that loses the answer to a client's nth request of one operation: the
//! request reaches the emulator and is applied, and the client reads a 500 in its place, as
//! a write whose answer timed out after it took looks to it (the SDK sends it again).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::orchestrator::{HttpResponse, Metadata};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;

/// The interceptor; `lost` says how many answers it lost.
#[derive(Debug, Clone)]
pub struct LoseAnswer {
    operation: &'static str,
    nth: usize,
    seen: Arc<AtomicUsize>,
    pub lost: Arc<AtomicUsize>,
}

impl LoseAnswer {
    /// Loses the answer to the `nth` (from 1) request of `operation` (e.g.
    /// "TransactWriteItems"), each attempt of the SDK's counted.
    pub fn new(operation: &'static str, nth: usize) -> Self {
        Self {
            operation,
            nth,
            seen: Arc::default(),
            lost: Arc::default(),
        }
    }
}

impl Intercept for LoseAnswer {
    fn name(&self) -> &'static str {
        "LoseAnswer"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let name = cfg.load::<Metadata>().map_or("?", |m| m.name());
        if name != self.operation || self.seen.fetch_add(1, Ordering::SeqCst) + 1 != self.nth {
            return Ok(());
        }
        let status = StatusCode::try_from(500).expect("500 is a status");
        let body = r#"{"__type":"InternalServerError","message":"the answer was lost"}"#;
        *context.response_mut() = HttpResponse::new(status, SdkBody::from(body));
        self.lost.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
