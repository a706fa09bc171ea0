//! conveyor-worker: the SQS task worker of the conveyor scraping system, for AWS Lambda.
//!
//! Each record goes through the same pipeline, one module a step:
//! [`message`] (parse) -> [`guard`] (skip finished work, claim) -> [`scraper`] (fetch) ->
//! [`converge`] (store under a deterministic key, make the one terminal write), with the stores
//! behind the ports [`task_store::TaskStore`] and [`result_store::ResultStore`]. [`batch`] runs
//! a batch concurrently and builds the partial batch response from the ack contract in
//! [`contract`]; [`visibility`] holds transiently failed messages back until their retry;
//! [`metrics`] reports each invocation in CloudWatch Embedded Metric Format.

pub mod aws;
pub mod batch;
pub mod config;
pub mod contract;
pub mod converge;
pub mod domain;
pub mod guard;
pub mod metrics;
pub mod ops;
pub mod retry;
pub mod scraper;
pub mod store;
pub mod worker;

pub use config::Config;
pub use contract::{Outcome, Reply};
pub use worker::Worker;
