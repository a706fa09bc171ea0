//! The adapters of the ports (`crate::ports`): tasks, jobs, runs, counters, hosts and spend in
//! DynamoDB ([`dynamo`]), result objects and the quarantine in S3 ([`s3`]), message visibility
//! and copies in SQS ([`sqs`]), the proxies' credentials in Secrets Manager ([`secrets`]).
//! AWS errors are classified in [`error`] before anything becomes text. Only the wiring
//! (`wiring/aws.rs`, `ops/`, the test kit) names them.

pub mod dynamo;
pub mod error;
pub mod lazy;
pub mod s3;
pub mod secrets;
pub mod sqs;
