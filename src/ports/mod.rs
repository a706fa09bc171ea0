//! The ports: the traits the steps call to read and write what outlives an invocation
//! (tasks, results, hosts, spend, the queue, secrets), each in domain types only. The
//! adapters in `store` and the test kit's in-process stores implement them.

pub mod error;
pub mod hosts;
pub mod queue;
pub mod results;
pub mod secrets;
pub mod spend;
pub mod tasks;
