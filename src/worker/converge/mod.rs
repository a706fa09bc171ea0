//! Converge: the page stored under the task's key, then the one terminal write that can win.

mod stores;

pub use stores::{Converged, Stores};
