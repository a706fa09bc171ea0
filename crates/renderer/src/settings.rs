//! The renderer's own settings, read from the environment beside the worker's (which it
//! shares: table, bucket, attempts, politeness, proxies). docs/rendering.md lists them; a
//! test below keeps the two in step.

use std::path::PathBuf;

use conveyor_worker::wiring::config::{ConfigError, Env};

use crate::browser_proxy::Bounds;
use crate::chromium::Launch;
use crate::fetcher::RenderSettings;

impl RenderSettings {
    /// The settings `get` gives, with the defaults for the unset ones. A rendered page's
    /// HTML is bounded as a fetched page's body is (`max_body_bytes`, `MAX_BODY_BYTES`).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        max_body_bytes: u64,
    ) -> Result<Self, ConfigError> {
        let env = Env(&get);
        let mib = |name, default| env.positive::<u64>(name, default).map(|m| m << 20);
        let launch = Launch {
            executable: PathBuf::from(env.text("CHROMIUM_PATH", DEFAULT_CHROMIUM)),
            timeout: env.millis("RENDER_LAUNCH_TIMEOUT_MS", 20_000)?,
            heap_mib: env.positive("RENDER_HEAP_MB", 512)?,
        };
        Ok(Self {
            launch,
            pages_per_browser: env.positive("RENDER_PAGES_PER_BROWSER", 50)?,
            max_resident_bytes: mib("RENDER_MAX_MEMORY_MB", 1_200)?,
            bounds: Bounds {
                requests: env.positive("RENDER_MAX_REQUESTS", 300)?,
                bytes: mib("RENDER_MAX_MB", 32)?,
            },
            max_elements: env.positive("RENDER_MAX_ELEMENTS", 100_000)?,
            max_html_bytes: usize::try_from(max_body_bytes).unwrap_or(usize::MAX),
            quiet: env.millis("RENDER_QUIET_MS", 500)?,
            load_media: env.parsed("RENDER_LOAD_MEDIA", false, "true or false")?,
        })
    }

    /// The settings of the environment.
    pub fn from_env(max_body_bytes: u64) -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok(), max_body_bytes)
    }
}

/// Where Debian's package, and the renderer's container image, put the headless browser.
pub const DEFAULT_CHROMIUM: &str = "/usr/bin/chromium-headless-shell";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_read_is_in_the_rendering_guide_and_defaults_apply() {
        let asked = std::sync::Mutex::new(Vec::new());
        let settings = RenderSettings::from_lookup(
            |name| {
                asked.lock().unwrap().push(name.to_owned());
                None
            },
            1 << 20,
        )
        .expect("the defaults");
        let guide = include_str!("../../../docs/rendering.md");

        let missing: Vec<String> = asked
            .into_inner()
            .unwrap()
            .into_iter()
            .filter(|name| !guide.contains(&format!("`{name}`")))
            .collect();

        assert!(missing.is_empty(), "not in docs/rendering.md: {missing:?}");
        assert_eq!(settings.bounds.requests, 300);
        assert_eq!(settings.max_html_bytes, 1 << 20);
        assert_eq!(settings.launch.executable, PathBuf::from(DEFAULT_CHROMIUM));
    }

    #[test]
    fn a_setting_out_of_range_is_named() {
        let get = |name: &str| (name == "RENDER_MAX_REQUESTS").then(|| "0".to_owned());

        let refused = RenderSettings::from_lookup(get, 1 << 20).expect_err("refused");

        assert!(
            refused.to_string().contains("RENDER_MAX_REQUESTS"),
            "{refused}"
        );
    }
}
