//! The Lambda entry point. It sets up logging, traces, configuration and clients once per
//! cold start, then runs the event loop.

use conveyor_worker::Config;
use conveyor_worker::wiring::aws::{self, AwsWorker};
use conveyor_worker::wiring::init_error::fail_init;
use conveyor_worker::wiring::lambda::{function_name, serve};
use conveyor_worker::wiring::traces;
use lambda_runtime::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let config = Config::from_env();
    let service = function_name("conveyor-worker");
    let traces = traces::init(config.as_ref().ok().map(|c| &c.tracing), &service);
    let config = match config {
        Ok(config) => config,
        Err(err) => return Err(fail_init("ConfigError", err).await),
    };
    let sdk = aws::SharedSdk::load(aws::Trust::CompiledIn);
    let secret = match aws::proxy_secret(&config, &sdk).await {
        Ok(secret) => secret,
        Err(err) => return Err(fail_init("ProxySecretError", err).await),
    };
    let worker = match AwsWorker::from_config(&config, &sdk, &secret) {
        Ok(worker) => worker,
        Err(err) => return Err(fail_init("BuildError", err).await),
    };
    serve(&worker, &config, &sdk, traces).await
}
