//! The renderer's Lambda entry point: the worker's cold start and event loop, with the
//! browser as its fetcher. Its records run the worker's pipeline (guard, claim, converge,
//! the ack contract); only the fetch is a render.

use std::sync::Arc;

use conveyor_renderer::fetcher::{BrowserFetcher, RenderSettings};
use conveyor_worker::Config;
use conveyor_worker::scraper::policy::{AddressPolicy, SystemLookup};
use conveyor_worker::scraper::{FetchSettings, HttpFetcher};
use conveyor_worker::wiring::aws::{self, SharedSdk};
use conveyor_worker::wiring::init_error::fail_init;
use conveyor_worker::wiring::lambda::{function_name, serve};
use conveyor_worker::wiring::traces;
use conveyor_worker::worker::Worker;
use lambda_runtime::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let config = Config::from_env();
    let service = function_name("conveyor-renderer");
    let traces = traces::init(config.as_ref().ok().map(|c| &c.tracing), &service);
    let config = match config {
        Ok(config) => config,
        Err(err) => return Err(fail_init("ConfigError", err).await),
    };
    let settings = match RenderSettings::from_env(config.max_body_bytes) {
        Ok(settings) => settings,
        Err(err) => return Err(fail_init("ConfigError", err).await),
    };
    let sdk = SharedSdk::load(aws::Trust::CompiledIn);
    let fetcher = match browser_fetcher(&config, &sdk, settings).await {
        Ok(fetcher) => fetcher,
        Err(err) => return Err(err),
    };
    let worker = Worker::on_aws(&config, &sdk, fetcher);
    serve(&worker, &config, &sdk, traces).await
}

/// The browser, with the plain fetcher for robots.txt and the URL checks, under the
/// worker's address policy and through its proxy tiers. The browser itself starts at the
/// first page.
async fn browser_fetcher(
    config: &Config,
    sdk: &SharedSdk,
    settings: RenderSettings,
) -> Result<BrowserFetcher, Error> {
    let secret = match aws::proxy_secret(config, sdk).await {
        Ok(secret) => secret,
        Err(err) => return Err(fail_init("ProxySecretError", err).await),
    };
    let fetch = FetchSettings::from(config);
    let plain = match HttpFetcher::new(&fetch, &secret) {
        Ok(plain) => plain,
        Err(err) => return Err(fail_init("BuildError", err).await),
    };
    let policy = AddressPolicy::new(config.allow_private_networks, config.allowed_ports.clone());
    let browser = BrowserFetcher::new(plain, (policy, Arc::new(SystemLookup)), settings);
    match browser.with_proxies(&fetch, &secret) {
        Ok(browser) => Ok(browser),
        Err(err) => Err(fail_init("ConfigError", err).await),
    }
}
