//! The types every step shares, free of AWS: ids, the message body, tasks and their ends,
//! a host's limits and their rule, its health, a refresh's earlier result, bounded text and time.

pub mod blocks;
pub mod bounds;
pub mod health;
pub mod ids;
pub mod limits;
pub mod message;
pub mod model;
pub mod proxy;
pub mod refresh;
pub mod spend;
pub mod time;
