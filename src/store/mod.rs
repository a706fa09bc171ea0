//! The adapters for the ports (`crate::ports`). Tasks, jobs, runs, counters, hosts and spend
//! live in DynamoDB ([`dynamo`]). Result objects and the quarantine live in S3 ([`s3`]).
//! Message visibility and copies go through SQS ([`sqs`]). The proxies' credentials are in
//! Secrets Manager ([`secrets`]). AWS errors are sorted into kinds in [`error`] before
//! anything becomes text. Only the wiring (`wiring/aws.rs`, `ops/`, the test kit) names
//! these adapters.

pub mod dynamo;
pub mod error;
pub mod lazy;
pub mod s3;
pub mod secrets;
pub mod sqs;
