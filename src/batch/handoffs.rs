//! Records handed on to a copy of their message. A record whose copy is sent ends as that
//! copy says, whatever cuts it after; a copy being sent is never cut in half. So one wait
//! leaves one live message, never the record beside its copy.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Notify;

use super::lock;
use crate::contract::Outcome;

/// The outcome a sent copy gives its record.
type Then = Box<dyn Fn() -> Outcome + Send + Sync>;

/// The copies this invocation's records sent, and those being sent now.
#[derive(Default)]
pub struct Handoffs {
    /// The outcome of each record whose copy was sent, by message id.
    sent: Mutex<HashMap<String, Then>>,
    /// Copies being sent now.
    sending: AtomicUsize,
    settled: Notify,
    /// The cutoff passed: no copy starts.
    cut: AtomicBool,
}

/// Why a copy was not sent: the cutoff had passed, or the send failed.
#[derive(Debug)]
pub enum NotSent<E> {
    Cut,
    Failed(E),
}

impl Handoffs {
    /// Sends a record's copy with `send`, unless the cutoff has passed. Once it is sent,
    /// `then` is the record's outcome, kept here in case the cutoff stops the record before
    /// it returns.
    pub async fn send<E>(
        &self,
        message_id: &str,
        send: impl Future<Output = Result<(), E>>,
        then: impl Fn() -> Outcome + Send + Sync + 'static,
    ) -> Result<Outcome, NotSent<E>> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(NotSent::Cut);
        }
        let _sending = Sending::start(self);
        send.await.map_err(NotSent::Failed)?;
        let outcome = then();
        lock(&self.sent).insert(message_id.to_owned(), Box::new(then));
        Ok(outcome)
    }

    /// The cutoff has passed: no copy starts from now on.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Waits until no copy is being sent.
    pub async fn settled(&self) {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so a send ending in between wakes it.
            notified.as_mut().enable();
            if self.sending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// The outcome of a record whose copy was sent, if it was.
    pub fn outcome_of(&self, message_id: &str) -> Option<Outcome> {
        lock(&self.sent).get(message_id).map(|then| then())
    }
}

impl std::fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoffs")
            .field("sent", &lock(&self.sent).len())
            .field("sending", &self.sending.load(Ordering::SeqCst))
            .finish()
    }
}

/// One copy being sent; counted until it is dropped (sent, failed, or cut anyway).
struct Sending<'h>(&'h Handoffs);

impl<'h> Sending<'h> {
    fn start(handoffs: &'h Handoffs) -> Self {
        handoffs.sending.fetch_add(1, Ordering::SeqCst);
        Self(handoffs)
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.sending.fetch_sub(1, Ordering::SeqCst);
        self.0.settled.notify_waiters();
    }
}
