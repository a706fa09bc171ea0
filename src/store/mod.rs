//! The ports the worker stores through, each beside its AWS adapter: tasks, jobs and runs in
//! DynamoDB, result objects and the quarantine in S3, message visibility in SQS. Every
//! DynamoDB write expression lives in [`expressions`]; AWS errors are classified in [`error`]
//! before anything becomes text.

pub mod attributes;
pub mod error;
pub mod expressions;
pub mod hosts;
pub mod keys;
pub mod queue;
pub mod results;
pub mod runs;
pub mod secrets;
pub mod shards;
pub mod spend;
pub mod tasks;
