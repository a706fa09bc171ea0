//! Which connections have answered a request. A request closed without an answer on one of
//! them met the idle-connection race: the peer closed the connection just as the pool
//! reused it. Such a request may be sent again. On a fresh connection, the peer read the
//! request and chose not to answer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};

use hyper_util::client::legacy::connect::HttpInfo;

use super::classify::find_cause;

/// How many connections are remembered (a pool keeps far fewer open at once).
const REMEMBERED: usize = 1024;

/// The connections, by their two ends, that have answered a request, the latest last.
#[derive(Debug, Default)]
pub(super) struct Answered(Mutex<VecDeque<(SocketAddr, SocketAddr)>>);

impl Answered {
    /// Notes the connection that answered `response`.
    pub(super) fn note(&self, response: &reqwest::Response) {
        let Some(info) = response.extensions().get::<HttpInfo>() else {
            return;
        };
        let ends = (info.local_addr(), info.remote_addr());
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !seen.contains(&ends) {
            if seen.len() == REMEMBERED {
                seen.pop_front();
            }
            seen.push_back(ends);
        }
    }

    /// Whether `err` failed on a connection that had answered before (was reused).
    pub(super) fn reused(&self, err: &reqwest::Error) -> bool {
        let Some(info) = connection_of(err) else {
            return false;
        };
        let ends = (info.local_addr(), info.remote_addr());
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.contains(&ends)
    }
}

/// The connection a request failed on, as the client's error names it.
fn connection_of(err: &reqwest::Error) -> Option<HttpInfo> {
    let failed = find_cause::<hyper_util::client::legacy::Error>(err)?;
    let mut extensions = http::Extensions::new();
    failed.connect_info()?.get_extras(&mut extensions);
    extensions.get::<HttpInfo>().cloned()
}
