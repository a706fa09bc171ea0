//! conveyor-worker: the SQS task worker of the conveyor scraping system, for AWS Lambda.
//!
//! The module map, by audience:
//!
//! | | modules |
//! |---|---|
//! | one record, start to end | [`worker`]: [`Worker::process`] calls one file per stage, in this order: `parse` -> `guard` (the one read) -> `admit` (wait for the host's turn through [`polite`]) -> `claim` (the task's attempt) -> `fetch` ([`scraper`]; [`paid`] keeps the paid proxy tier within budget) -> [`worker::converge`] (store the page, then the one terminal write) -> `park` (send a fresh copy or hold the message back) |
//! | the front door | [`handler`]: the Lambda handler, one SQS batch in and its reply out |
//! | a batch | [`batch`] runs a batch within its deadline and builds the partial batch response. [`contract`] is the ack contract, as one table |
//! | around the records | [`pushback`]: [`pushback::retry`] (retry conflicting writes), [`pushback::backoff`] (when a retry is due), [`pushback::pressure`] (how many records run at once while AWS throttles). [`metrics`]: CloudWatch EMF. [`trace`]: one trace per task, carried from the producer through every copy |
//! | the stores | [`ports`]: the storage traits the stages call, in domain types. [`store`]: their DynamoDB, S3, SQS and Secrets Manager adapters, with each item type's write expressions next to it and AWS errors sorted into kinds |
//! | shared types | [`domain`]: ids, message, model, bounded text, time |
//! | wiring | [`wiring`]: [`wiring::config`] (the environment variables), [`wiring::settings`] (each stage's settings, read from them once), [`wiring::aws`] (SDK config and clients, the production worker), [`wiring::init_error`] (a cold start that fails, reported) |
//! | operators | not here: the `conveyor-ops` crate (`crates/ops`) has the operator's routines, its tool and the local event source mapping |

pub mod batch;
pub mod contract;
pub mod domain;
pub mod handler;
pub mod metrics;
pub mod paid;
pub mod polite;
pub mod ports;
pub mod pushback;
pub mod scraper;
pub mod store;
pub mod trace;
pub mod wiring;
pub mod worker;

pub use contract::{Outcome, Reply};
pub use wiring::config::Config;
pub use worker::Worker;
