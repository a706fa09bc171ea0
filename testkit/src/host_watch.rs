//! What the fleet decided for one host over a run, read from its host item as the run goes:
//! the slowdown, cooldown and failing state in force at each look. Tests bound these
//! decisions, not the machine's speed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor_worker::domain::limits::Host;
use conveyor_worker::ports::hosts::HostStore;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use reqwest::Url;
use tokio::task::JoinHandle;

use crate::{Stack, now_ms};

/// How often the host item is read.
const EVERY: Duration = Duration::from_millis(200);

/// One look at the host item.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Look {
    /// When, in ms since the epoch.
    pub at: u64,
    /// The slowdown in force then: 1 at the job's ceiling, 4 at a quarter of it.
    pub slowdown: f64,
    /// No fetch could start then (a cooldown).
    pub cooling: bool,
    /// The site was failing then: one fetch at a time.
    pub failing: bool,
}

/// Reads a host's item every 200 ms until dropped or [`HostWatch::looks`] is called.
pub struct HostWatch {
    looks: Arc<Mutex<Vec<Look>>>,
    reader: JoinHandle<()>,
}

impl HostWatch {
    /// Starts reading the item of `url`'s host (its politeness key by host name).
    pub fn start(stack: &Stack, url: &str) -> Self {
        let url = Url::parse(url).expect("a URL");
        let host = Host::of(&url).expect("a host");
        let store = DynamoTaskStore::new(stack.dynamodb.clone(), &stack.table);
        let looks = Arc::new(Mutex::new(Vec::new()));
        let kept = looks.clone();
        let reader = tokio::spawn(async move {
            loop {
                if let Ok(state) = store.host(&host).await {
                    let at = now_ms();
                    let look = Look {
                        at,
                        slowdown: state.slowdown_at(at),
                        cooling: state.cooldown_until.is_some_and(|until| until > at),
                        failing: state.failing_until.is_some_and(|until| until > at),
                    };
                    kept.lock().expect("not poisoned").push(look);
                }
                tokio::time::sleep(EVERY).await;
            }
        });
        Self { looks, reader }
    }

    /// Every look so far; reading stops.
    pub fn looks(self) -> Vec<Look> {
        self.reader.abort();
        let looks = self.looks.lock().expect("not poisoned");
        looks.clone()
    }
}

impl Drop for HostWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
