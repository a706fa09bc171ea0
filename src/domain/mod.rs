//! The types every step shares, free of AWS: ids, the message body, tasks and their ends,
//! bounded text and time.

pub mod bounds;
pub mod ids;
pub mod message;
pub mod model;
pub mod spend;
pub mod time;
