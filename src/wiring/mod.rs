//! The wiring, built once per cold start. [`config`] reads the configuration from the
//! environment. [`settings`] builds each stage's settings from it. [`aws`] holds the AWS
//! clients and the production worker. [`traces`] installs logging and, when it is on, the
//! trace exporter, whose spans [`span_buffer`] keeps until the invocation's flush. [`init_error`] reports a cold start that cannot go on. [`lambda`] runs the event loop
//! both functions share. Nothing below the
//! wiring reads `config`. The Lambda handler itself is [`crate::handler`].

pub mod aws;
pub mod config;
pub mod init_error;
pub mod lambda;
pub mod settings;
pub mod span_buffer;
pub mod traces;
