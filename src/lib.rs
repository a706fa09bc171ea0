//! conveyor-worker: the SQS task worker of the conveyor scraping system, for AWS Lambda.
//!
//! The module map, by audience:
//!
//! | | modules |
//! |---|---|
//! | the record's pipeline | [`worker`]: a file per stage, in order: `parse` -> [`worker::guard`] (the one read) -> `admit` (the host's turn through [`polite`], the claim) -> `fetch` ([`scraper`], the paid tier held back through [`paid`]) -> [`worker::converge`] (store, the one terminal write) -> `park` (copies and holds) |
//! | a batch | [`batch`] runs a batch within its deadline and builds the partial batch reply; [`contract`] is the ack contract, one table |
//! | around the records | [`pushback`]: [`pushback::retry`] (conflicts tried again), [`pushback::backoff`] (when a retry is due), [`pushback::pressure`] (records at once under AWS push-back), [`metrics`] (EMF) |
//! | the stores | [`ports`]: the traits the steps store through, in domain types; [`store`]: their DynamoDB, S3, SQS and Secrets Manager adapters, each item kind's write expressions beside it, AWS errors classified |
//! | shared types | [`domain`]: ids, message, model, bounded text, time |
//! | wiring | [`wiring`]: [`wiring::config`] (the environment), [`wiring::settings`] (each step's settings from it, read once), [`wiring::aws`] (SDK config and clients, the production worker, the Lambda handler) |
//! | operators | [`ops`]: progress, requeue, replay, and the local event source mapping (`conveyor-ops`) |

pub mod batch;
pub mod contract;
pub mod domain;
pub mod metrics;
pub mod ops;
pub mod paid;
pub mod polite;
pub mod ports;
pub mod pushback;
pub mod scraper;
pub mod store;
pub mod wiring;
pub mod worker;

pub use contract::{Outcome, Reply};
pub use wiring::config::Config;
pub use worker::Worker;
