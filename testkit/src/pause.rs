//! An SDK interceptor that stops a client before its nth request of one operation until the
//! test says go on: to put another writer's step between two of the worker's, exactly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// The interceptor: it blocks its thread (so the test runs on a multi-threaded runtime).
#[derive(Debug, Clone)]
pub struct PauseBefore {
    operation: &'static str,
    nth: usize,
    seen: Arc<AtomicUsize>,
    reached: mpsc::SyncSender<()>,
    resume: Arc<Mutex<mpsc::Receiver<()>>>,
}

/// The test's side: wait for the pause, then let the request go.
#[derive(Debug)]
pub struct Paused {
    reached: Mutex<mpsc::Receiver<()>>,
    resume: mpsc::SyncSender<()>,
}

impl PauseBefore {
    /// Stops before the `nth` (from 1) request of `operation` (e.g. "TransactWriteItems").
    pub fn new(operation: &'static str, nth: usize) -> (Self, Paused) {
        let (reached, reached_rx) = mpsc::sync_channel(1);
        let (resume, resume_rx) = mpsc::sync_channel(1);
        let pause = Self {
            operation,
            nth,
            seen: Arc::default(),
            reached,
            resume: Arc::new(Mutex::new(resume_rx)),
        };
        let paused = Paused {
            reached: Mutex::new(reached_rx),
            resume,
        };
        (pause, paused)
    }
}

impl Paused {
    /// Waits until the client is stopped before the request.
    pub async fn reached(&self) {
        let reached = self.reached.lock().unwrap_or_else(|p| p.into_inner());
        tokio::task::block_in_place(|| reached.recv()).expect("the paused client is gone");
    }

    /// Lets the stopped request go.
    pub fn resume(&self) {
        self.resume.send(()).expect("the paused client is gone");
    }
}

impl Intercept for PauseBefore {
    fn name(&self) -> &'static str {
        "PauseBefore"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let name = cfg.load::<Metadata>().map_or("?", |m| m.name());
        if name != self.operation || self.seen.fetch_add(1, Ordering::SeqCst) + 1 != self.nth {
            return Ok(());
        }
        self.reached.send(())?;
        let resume = self.resume.lock().unwrap_or_else(|p| p.into_inner());
        tokio::task::block_in_place(|| resume.recv())?;
        Ok(())
    }
}
