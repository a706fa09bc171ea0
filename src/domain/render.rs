//! When a task's page is rendered in a browser: the job's `render` (`never`, `always` or
//! `auto`) with its options, and a task's own `render` over the job's. `never` is the
//! default, so a job or task written before these fields existed reads as before. Each value
//! is checked here; one that is not valid is dropped (the job's reader warns).
//!
//! Every file of the rendering feature: here (a job's choice, and a page's [`Rendering`]);
//! the application shell rule in `domain/shells.rs`; the job's fields read in
//! `store/dynamo/jobs.rs` and the task's in `store/dynamo/tasks/mod.rs`; a stored page
//! checked in `worker/converge/stores.rs`, its marks kept on the object (`store/s3.rs`,
//! `meta::SHELL`, `meta::RENDERED`) and on the task (`store/dynamo/tasks/writes.rs`); the
//! job's options handed to the fetcher in `Ask::render` (`scraper/fetcher.rs`); the corpus
//! in `tests/fixtures/shells/`; the renderer itself in `crates/renderer/` (its map:
//! `crates/renderer/src/lib.rs`).

use std::time::Duration;

/// When a page is rendered in a browser.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Render {
    /// The plain fetch's bytes are stored, whatever they are (a shell is marked).
    #[default]
    Never,
    /// Every page is rendered.
    Always,
    /// The plain fetch first; a page that is an application shell is rendered.
    Auto,
}

impl Render {
    pub const ALL: [Self; 3] = [Self::Never, Self::Always, Self::Auto];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Always => "always",
            Self::Auto => "auto",
        }
    }

    /// `raw` as the job or task item spells it; `None` for any other value.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == raw)
    }
}

/// The longest `render_wait_for` selector kept, in bytes.
pub const MAX_SELECTOR_BYTES: usize = 256;
/// The shortest and longest `render_timeout_ms` kept.
pub const MIN_RENDER_TIMEOUT: Duration = Duration::from_secs(1);
pub const MAX_RENDER_TIMEOUT: Duration = Duration::from_secs(120);

/// A CSS selector the rendered page must show before it is taken (`render_wait_for`):
/// 1 to [`MAX_SELECTOR_BYTES`] bytes, without control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(String);

impl Selector {
    pub fn parse(raw: &str) -> Option<Self> {
        let fits = (1..=MAX_SELECTOR_BYTES).contains(&raw.len());
        (fits && !raw.chars().any(char::is_control) && !raw.trim().is_empty())
            .then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A job's rendering choice and options. Each option is `None` (or off) unless the job set
/// a valid one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderOptions {
    pub render: Render,
    pub wait_for: Option<Selector>,
    /// How long one render may take (`render_timeout_ms`), within the invocation's cut.
    pub timeout: Option<Duration>,
    /// A PNG of the rendered page beside it (`render_screenshot`).
    pub screenshot: bool,
}

impl RenderOptions {
    /// The job's `render_timeout_ms`, when it is within the bounds.
    pub fn timeout_of(ms: u64) -> Option<Duration> {
        let timeout = Duration::from_millis(ms);
        (MIN_RENDER_TIMEOUT..=MAX_RENDER_TIMEOUT)
            .contains(&timeout)
            .then_some(timeout)
    }

    /// What a task does: its own `render` when it has one, else the job's.
    pub fn for_task(&self, task: Option<Render>) -> Render {
        task.unwrap_or(self.render)
    }
}

/// A page rendered in a browser: what its render asked for through the renderer's guard.
/// Kept on the result object (`rendered`, as `requests=N bytes=M`) and, as `rendered`, on
/// the task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rendering {
    pub requests: u32,
    pub bytes: u64,
}

impl Rendering {
    /// The object metadata's value: at most 46 bytes (`requests=` and 10 digits, ` bytes=`
    /// and 20).
    pub fn to_meta(self) -> String {
        format!("requests={} bytes={}", self.requests, self.bytes)
    }

    /// An object's `rendered` value as [`Rendering::to_meta`] wrote it. One written by a
    /// later release in a form this one does not know still says the page was rendered.
    pub fn from_meta(meta: &str) -> Self {
        let field = |name: &str| {
            meta.split(' ')
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        };
        Self {
            requests: field("requests").and_then(|n| n.parse().ok()).unwrap_or(0),
            bytes: field("bytes").and_then(|n| n.parse().ok()).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendering_reads_back_as_written_and_an_unknown_form_still_says_rendered() {
        let most = Rendering {
            requests: u32::MAX,
            bytes: u64::MAX,
        };

        let read = Rendering::from_meta(&most.to_meta());

        assert_eq!(read, most);
        assert_eq!(most.to_meta().len(), 46);
        assert_eq!(Rendering::from_meta("v2;r=3"), Rendering::default());
    }

    #[test]
    fn render_reads_its_three_words_and_nothing_else() {
        let read: Vec<_> = ["never", "always", "auto", "Auto", "", "sometimes"]
            .into_iter()
            .map(Render::parse)
            .collect();

        assert_eq!(
            read,
            [
                Some(Render::Never),
                Some(Render::Always),
                Some(Render::Auto),
                None,
                None,
                None
            ]
        );
        assert_eq!(Render::default(), Render::Never);
    }

    #[test]
    fn a_selector_is_kept_only_within_its_bounds() {
        let longest = "a".repeat(MAX_SELECTOR_BYTES);
        let too_long = "a".repeat(MAX_SELECTOR_BYTES + 1);

        assert!(Selector::parse("#prices .row").is_some());
        assert!(Selector::parse(&longest).is_some());
        assert!(Selector::parse(&too_long).is_none());
        assert!(Selector::parse("").is_none());
        assert!(Selector::parse("   ").is_none());
        assert!(Selector::parse("#a\n#b").is_none());
    }

    #[test]
    fn a_timeout_is_kept_only_within_its_bounds() {
        assert_eq!(RenderOptions::timeout_of(999), None);
        assert_eq!(
            RenderOptions::timeout_of(1_000),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            RenderOptions::timeout_of(120_000),
            Some(Duration::from_secs(120))
        );
        assert_eq!(RenderOptions::timeout_of(120_001), None);
    }

    #[test]
    fn a_task_s_own_render_wins_over_its_job_s() {
        let job = RenderOptions {
            render: Render::Auto,
            ..RenderOptions::default()
        };

        assert_eq!(job.for_task(None), Render::Auto);
        assert_eq!(job.for_task(Some(Render::Never)), Render::Never);
        assert_eq!(
            RenderOptions::default().for_task(Some(Render::Always)),
            Render::Always
        );
    }
}
