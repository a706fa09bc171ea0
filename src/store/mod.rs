//! The ports the worker stores through, each beside its AWS adapter: tasks, jobs and runs in
//! DynamoDB, result objects and the quarantine in S3, message visibility in SQS.

pub mod error;
pub mod queue;
pub mod results;
pub mod tasks;
