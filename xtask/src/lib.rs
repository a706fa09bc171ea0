//! conveyor-worker's tooling as a library: the run progress simulation (`make bench`), and
//! the sections the benchmarks write into BENCHMARKS.md.

pub mod simulation;

/// The markers of the renderer's section of BENCHMARKS.md (`render-bench`), which `bench`
/// keeps when it writes the rest.
pub const RENDER_SECTION: (&str, &str) = (
    "<!-- render-bench: written by `make bench-render` -->",
    "<!-- /render-bench -->",
);

/// `doc` with `section` between the markers `begin` and `end` (the section includes them),
/// replacing what was there, or added at the end.
pub fn splice(doc: &str, begin: &str, end: &str, section: &str) -> String {
    match (doc.find(begin), doc.find(end)) {
        (Some(from), Some(to)) if from < to => {
            let after = &doc[to + end.len()..];
            let after = after.strip_prefix('\n').unwrap_or(after);
            format!("{}{section}{after}", &doc[..from])
        }
        _ => format!("{}\n\n{section}", doc.trim_end_matches('\n')),
    }
}

/// The section of `doc` between `begin` and `end`, markers included, if it has one.
pub fn section<'a>(doc: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let from = doc.find(begin)?;
    let to = doc[from..].find(end)? + from + end.len();
    Some(&doc[from..to])
}
