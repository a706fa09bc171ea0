//! Every integration test, in one binary (the AWS SDK is linked once), a module per
//! behaviour. They run against the emulator that `make test` starts (`scripts/with-moto`),
//! plain or behind the production-like layer, and real local sites.

mod ack_contract;
mod adaptive;
mod blocks;
mod chaos;
mod cold_start;
mod compatibility;
mod fetching;
mod lineage;
mod matrix;
mod observability;
mod operator;
mod ops;
mod polite_defaults;
mod politeness;
mod previous_release;
mod producer;
mod production;
mod proxies;
mod races;
mod redirects;
mod refresh_runs;
mod render;
mod renderer;
mod retry_timing;
mod run_progress;
mod sample_events;
mod sdk_errors;
mod traces;
