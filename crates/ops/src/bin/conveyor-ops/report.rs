//! Progress as a person watches it: a bar with rate and ETA on a terminal, plain lines
//! otherwise (logs, pipes, tests), at most one every few seconds.

use std::io::IsTerminal;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Reports `done` out of a total.
pub struct Reporter {
    bar: Option<ProgressBar>,
    total: u64,
    what: &'static str,
    /// When the last plain line was printed, if one was.
    printed: Mutex<Option<Instant>>,
    every: Duration,
}

impl Reporter {
    /// `what` names the things counted ("tasks submitted").
    pub fn new(total: u64, what: &'static str, every: Duration) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(total).with_style(style).with_message(what)
        });
        Self {
            bar,
            total,
            what,
            printed: Mutex::new(None),
            every,
        }
    }

    /// `done` so far (a plain line only every `every`, and at the end).
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let mut printed = self.printed.lock().unwrap_or_else(PoisonError::into_inner);
        let due = printed.is_none_or(|at| at.elapsed() >= self.every);
        if due || done >= self.total {
            say!("{done}/{} {}", self.total, self.what);
            *printed = Some(Instant::now());
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
