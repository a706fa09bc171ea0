//! Log output kept in memory, for tests that read what the worker logged.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes written by a `tracing_subscriber::fmt` writer (`with_writer(move || logs.clone())`).
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.bytes().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        // A writer that panicked mid-write leaves whole lines before it: still readable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Everything written so far, emptying the buffer.
    pub fn take(&self) -> String {
        let bytes = std::mem::take(&mut *self.bytes());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
