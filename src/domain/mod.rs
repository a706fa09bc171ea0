//! The types every stage shares, with nothing from AWS in them: ids, the message body, tasks
//! and their end states, a task's redirects, a host's limits and the rule that applies them, the host's health, a
//! refresh's earlier result, bounded text and time.

pub mod blocks;
pub mod bounds;
pub mod health;
pub mod hops;
pub mod ids;
pub mod limits;
pub mod message;
pub mod model;
pub mod proxy;
pub mod refresh;
pub mod render;
pub mod shells;
pub mod spend;
pub mod time;
