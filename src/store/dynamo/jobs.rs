//! The job item as the worker reads it: the job's own politeness (host limits, robots.txt,
//! how hosts are keyed), its block detection (on or off, its own signatures) and when its
//! pages are rendered. Each value is checked. A value out of range or not valid is dropped
//! with a warning.

use crate::domain::blocks::{Detection, JobSignature, MAX_JOB_SIGNATURES};
use crate::domain::bounds::Reason;
use crate::domain::limits::{JobPoliteness, PoliteKey};
use crate::domain::render::{Render, RenderOptions, Selector};
use crate::store::dynamo::attributes::{Item, number, string};

/// A job's own politeness. Each attribute is taken only when it is in range. Otherwise the
/// fleet's setting applies, with a warning.
pub(super) fn politeness(job: &Item) -> JobPoliteness {
    let rps = number::<f64>(job, "host_max_rps");
    let inflight = number::<u32>(job, "host_max_inflight");
    let obey = job.get("obey_robots").and_then(|v| v.as_bool().ok());
    let (mut politeness, dropped) = JobPoliteness::in_range(rps, inflight, obey.copied());
    if dropped {
        tracing::warn!(
            ?rps,
            ?inflight,
            "a job's host limits are out of range: the fleet's apply"
        );
    }
    if let Some(text) = string(job, "politeness_key") {
        match PoliteKey::parse(text) {
            Some(key) => politeness.key = key,
            None => tracing::warn!(
                key = %Reason::new(text),
                "a job's politeness_key is not host, domain or address: by host"
            ),
        }
    }
    politeness
}

/// How a job's pages are checked for block pages. Off when `block_detection` is false.
/// Otherwise the table and the job's `block_signatures` apply. Each signature is a map:
/// `name`, and either `header` with `contains`, or `body`. A signature that is not valid is
/// dropped with a warning.
pub(super) fn detection(job: &Item) -> Detection {
    if job.get("block_detection").and_then(|v| v.as_bool().ok()) == Some(&false) {
        return Detection::off();
    }
    let Some(listed) = job.get("block_signatures").and_then(|v| v.as_l().ok()) else {
        return Detection::default();
    };
    let mut signatures = Vec::new();
    for entry in listed.iter().take(MAX_JOB_SIGNATURES) {
        match entry.as_m().ok().and_then(job_signature) {
            Some(signature) => signatures.push(signature),
            None => tracing::warn!("a job's block signature is not valid: dropped"),
        }
    }
    if listed.len() > MAX_JOB_SIGNATURES {
        tracing::warn!(
            listed = listed.len(),
            "a job lists more block signatures than {MAX_JOB_SIGNATURES}: the first are kept"
        );
    }
    Detection::with(signatures)
}

fn job_signature(entry: &Item) -> Option<JobSignature> {
    let name = string(entry, "name").unwrap_or_default();
    match (string(entry, "header"), string(entry, "body")) {
        (Some(header), None) => JobSignature::header(name, header, string(entry, "contains")?),
        (None, Some(body)) => JobSignature::body(name, body),
        _ => None,
    }
}

/// When a job's pages are rendered, and how. A value that is not valid leaves that option
/// at its default (`render`: never), with a warning.
pub(super) fn render(job: &Item) -> RenderOptions {
    let mut options = RenderOptions {
        render: render_word(job, "render").unwrap_or_default(),
        ..RenderOptions::default()
    };
    if let Some(text) = string(job, "render_wait_for") {
        options.wait_for = Selector::parse(text);
        if options.wait_for.is_none() {
            tracing::warn!(
                selector = %Reason::new(text),
                "a job's render_wait_for is not a selector of 1 to 256 bytes: not waited for"
            );
        }
    }
    if let Some(ms) = number::<u64>(job, "render_timeout_ms") {
        options.timeout = RenderOptions::timeout_of(ms);
        if options.timeout.is_none() {
            tracing::warn!(
                ms,
                "a job's render_timeout_ms is out of range: the default applies"
            );
        }
    }
    options.screenshot = job.get("render_screenshot").and_then(|v| v.as_bool().ok()) == Some(&true);
    options
}

/// A job's or task's `render` word, warned about when it is not one of the three.
pub(crate) fn render_word(item: &Item, name: &str) -> Option<Render> {
    let text = string(item, name)?;
    let render = Render::parse(text);
    if render.is_none() {
        tracing::warn!(
            value = %Reason::new(text),
            "{name} is not never, always or auto: ignored"
        );
    }
    render
}
