//! The renderer as the tests run it: Debian's headless Chromium (or `CHROMIUM_PATH`), the
//! renderer's settings at their defaults, and the renderer's worker on the local stack.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conveyor_renderer::browser_proxy::Bounds;
use conveyor_renderer::chromium::Launch;
use conveyor_renderer::fetcher::{BrowserFetcher, RenderSettings};
use conveyor_worker::Worker;
use conveyor_worker::scraper::HttpFetcher;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::SqsVisibility;

use super::{Stack, WorkerTuning};

/// The renderer's worker: the worker's pipeline with the browser as its fetcher.
pub type TestRenderer = Worker<DynamoTaskStore, S3ResultStore, BrowserFetcher, SqsVisibility>;

/// Debian's headless Chromium, as `make test` installs it, unless `CHROMIUM_PATH` names
/// another.
pub fn launch() -> Launch {
    let executable = std::env::var_os("CHROMIUM_PATH").map_or_else(
        || PathBuf::from("/usr/bin/chromium-headless-shell"),
        PathBuf::from,
    );
    Launch {
        executable,
        timeout: Duration::from_secs(20),
        heap_mib: 512,
    }
}

/// The renderer's defaults, as its `settings.rs` sets them.
pub fn render_settings() -> RenderSettings {
    RenderSettings {
        launch: launch(),
        pages_per_browser: 100,
        max_resident_bytes: 1 << 30,
        bounds: Bounds {
            requests: 500,
            bytes: 16 << 20,
        },
        max_elements: 100_000,
        max_html_bytes: 4 << 20,
        quiet: Duration::from_millis(300),
        load_media: false,
    }
}

impl Stack {
    /// The renderer under test, tuned by `tune`: its pages go through the tuning's proxy
    /// tiers with its secret, and robots.txt through the plain fetcher, as deployed.
    pub fn renderer_with(&self, tune: impl FnOnce(&mut WorkerTuning)) -> TestRenderer {
        self.renderer_of(render_settings(), tune)
    }

    /// [`Stack::renderer_with`], the browser as `settings` say.
    pub fn renderer_of(
        &self,
        settings: RenderSettings,
        tune: impl FnOnce(&mut WorkerTuning),
    ) -> TestRenderer {
        self.worker_fetching(tune, |tuning, (fetch, policy, lookup)| {
            let secret = &tuning.proxy_secret;
            let plain = HttpFetcher::with_policy(&fetch, policy.clone(), Arc::clone(&lookup))
                .and_then(|plain| plain.with_proxies(&fetch, secret))
                .expect("a client");
            BrowserFetcher::new(plain, (policy, lookup), settings)
                .with_proxies(&fetch, secret)
                .expect("http proxies")
        })
    }
}
