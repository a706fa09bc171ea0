//! The ports the worker stores through, each beside its AWS adapter: tasks, jobs and runs in
//! DynamoDB ([`dynamo`]), result objects and the quarantine in S3 ([`s3`]), message visibility
//! in SQS ([`sqs`]). AWS errors are classified in [`error`] before anything becomes text.

pub mod dynamo;
pub mod error;
pub mod s3;
pub mod secrets;
pub mod sqs;
