//! Fault injection for the chaos run: an HTTP client for the AWS SDKs that fails or delays a
//! share of requests, and a result store that "crashes" after the S3 write, before the
//! terminal write.

use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use conveyor_worker::domain::ids::{QuarantineKey, ResultKey};
use conveyor_worker::domain::model::StoredResult;
use conveyor_worker::domain::refresh::Prior;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::ports::results::{
    Carried, Copied, EarlierCheck, NewResult, Opening, Put, ResultStore,
};

/// How often, and how, AWS misbehaves.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Share of requests answered with a 500 instead of reaching the emulator.
    pub error_rate: f64,
    /// Share of requests delayed by `delay` first.
    pub slow_rate: f64,
    pub delay: Duration,
}

/// Wraps the SDK's HTTP client.
#[derive(Debug, Clone)]
pub struct ChaosHttp {
    pub inner: SharedHttpClient,
    pub faults: Faults,
}

impl HttpClient for ChaosHttp {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(ChaosConnector {
            inner: self.inner.http_connector(settings, components),
            faults: self.faults,
        })
    }
}

#[derive(Debug)]
struct ChaosConnector {
    inner: SharedHttpConnector,
    faults: Faults,
}

impl HttpConnector for ChaosConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let (inner, faults) = (self.inner.clone(), self.faults);
        HttpConnectorFuture::new(async move {
            if fastrand::f64() < faults.slow_rate {
                tokio::time::sleep(faults.delay).await;
            }
            if fastrand::f64() < faults.error_rate {
                // A 5xx both DynamoDB (JSON) and S3 (XML) clients read as a server error.
                let status = StatusCode::try_from(500).expect("500 is a status");
                return Ok(HttpResponse::new(status, SdkBody::from("InternalError")));
            }
            inner.call(request).await
        })
    }
}

/// A result store whose process "dies" (panics) right after a share of its S3 writes.
pub struct Crashing<R> {
    pub inner: R,
    pub crash_rate: f64,
}

impl<R: ResultStore> ResultStore for Crashing<R> {
    async fn put_if_absent(&self, new: NewResult<'_>) -> Result<Put, StoreError> {
        let put = self.inner.put_if_absent(new).await?;
        if fastrand::f64() < self.crash_rate {
            panic!("injected crash after the S3 write, before the terminal write");
        }
        Ok(put)
    }

    async fn describe(&self, key: &ResultKey) -> Result<Option<StoredResult>, StoreError> {
        self.inner.describe(key).await
    }

    async fn opening(&self, key: &ResultKey, most: usize) -> Result<Option<Opening>, StoreError> {
        self.inner.opening(key, most).await
    }

    async fn replace(&self, new: NewResult<'_>, etag: &str) -> Result<Put, StoreError> {
        self.inner.replace(new, etag).await
    }

    async fn check_earlier(&self, prior: &Prior) -> Result<EarlierCheck, StoreError> {
        self.inner.check_earlier(prior).await
    }

    async fn carry_if_absent(&self, carried: Carried<'_>) -> Result<Copied, StoreError> {
        let copied = self.inner.carry_if_absent(carried).await?;
        if fastrand::f64() < self.crash_rate {
            panic!("injected crash after the S3 copy, before the terminal write");
        }
        Ok(copied)
    }

    async fn carry_replacing(
        &self,
        carried: Carried<'_>,
        etag: &str,
    ) -> Result<Copied, StoreError> {
        self.inner.carry_replacing(carried, etag).await
    }

    async fn quarantine(&self, key: &QuarantineKey, document: Vec<u8>) -> Result<(), StoreError> {
        self.inner.quarantine(key, document).await
    }
}

/// Keeps the injected crashes' panics out of the output, and nothing else.
pub fn quiet_injected_crashes() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .unwrap_or_default();
        if !message.starts_with("injected crash") {
            default_hook(info);
        }
    }));
}
