//! The ports: the traits the stages call to read and write state that outlives an
//! invocation. They cover tasks, results, hosts, spend, the queue and secrets, in domain
//! types only. The adapters in `store` and the test kit's in-process stores implement them.

pub mod error;
pub mod hosts;
pub mod queue;
pub mod results;
pub mod secrets;
pub mod spend;
pub mod tasks;
