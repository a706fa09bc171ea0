//! The wiring, built once per cold start. [`config`] reads the configuration from the
//! environment. [`settings`] builds each stage's settings from it. [`aws`] holds the AWS
//! clients, the production worker and the Lambda handler. [`traces`] installs logging and,
//! when it is on, the trace exporter. Nothing below the wiring reads
//! `config`.

pub mod aws;
pub mod config;
pub mod settings;
pub mod traces;
