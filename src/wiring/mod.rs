//! The wiring, built once per cold start: the configuration read from the environment
//! ([`config`]), each step's settings made from it ([`settings`]), and the AWS clients, the
//! production worker and the Lambda handler ([`aws`]). Nothing below it reads `config`.

pub mod aws;
pub mod config;
pub mod settings;
