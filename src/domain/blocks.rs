//! Block and challenge pages. This module holds the signatures of the common bot managers,
//! as one table where each row names its source. It also holds a job's own signatures, and
//! the check of one response against both.
//!
//! Every file of the block pages feature: here (the rule); the check of each response in
//! `scraper/egress.rs`, `scraper/fetcher.rs` and `scraper/error.rs` (a block is a reason to
//! climb a tier); a job's own signatures read in `store/dynamo/jobs.rs` and
//! `worker/parents.rs`; a stored object checked before it is adopted in
//! `worker/blocked.rs`; the task's failure in `worker/converge/stores.rs`; the operator's
//! count in `crates/ops/src/bin/conveyor-ops/results.rs`.
//!
//! A bot manager answers a scraper with a challenge or block page instead of the real page,
//! often with status `200`. Headers are checked first, with one lookup each. Then the body's
//! first [`BODY_WINDOW`] bytes are checked, by the document's title. A row whose title
//! matches must also find its markers in that window. So an article that mentions "Just a
//! moment..." or "Access Denied" is not taken for a block. A block page without a title of
//! its own (DataDome's shows the site's name) is small. So only bodies of at most
//! [`SMALL_PAGE`] bytes are searched for its markers. The title is found in one `memchr`
//! pass, so the check costs a fraction of the page's SHA-256.

use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use memchr::memmem;

use super::bounds::{Bounded, is_html_type};

/// How much of a body is searched for signatures. Every bot manager's page names itself
/// well within it.
pub const BODY_WINDOW: usize = 64 * 1024;

/// The largest body searched for the markers of a block page without a title of its own.
pub const SMALL_PAGE: usize = 8 * 1024;

/// The longest title read. Block pages have short titles.
const MAX_TITLE_BYTES: usize = 256;

/// The most signatures a job may add.
pub const MAX_JOB_SIGNATURES: usize = 8;

/// The longest pattern a job's signature may have (a header's value, or bytes of a body),
/// and the shortest body pattern. Shorter body patterns would match real pages.
pub const MAX_PATTERN_BYTES: usize = 256;
pub const MIN_BODY_PATTERN_BYTES: usize = 8;

/// Where a signature looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The response has this header (lowercase name), and its trimmed value is this one,
    /// ignoring ASCII case.
    Header(&'static str, &'static str),
    /// The document's title is this one, and the body's window holds every one of these
    /// byte strings (case-sensitive). Titles are compared trimmed, ignoring ASCII case, with
    /// a final `.` or `…` dropped.
    Titled(&'static str, &'static [&'static str]),
    /// A body of at most [`SMALL_PAGE`] bytes holds every one of these byte strings.
    Small(&'static [&'static str]),
}

/// One row of the table: the bot manager and what it shows, the signal, and the source.
/// The source is the vendor's documentation, or the page as it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    pub name: &'static str,
    pub signal: Signal,
    pub source: &'static str,
}

/// The signatures of the common bot managers.
pub const SIGNATURES: &[Signature] = &[
    Signature {
        name: "cloudflare challenge",
        signal: Signal::Header("cf-mitigated", "challenge"),
        source: "https://developers.cloudflare.com/cloudflare-challenges/challenge-types/challenge-pages/detect-response/",
    },
    Signature {
        name: "aws waf captcha",
        signal: Signal::Header("x-amzn-waf-action", "captcha"),
        source: "https://docs.aws.amazon.com/waf/latest/developerguide/waf-captcha-and-challenge-actions.html",
    },
    Signature {
        name: "aws waf challenge",
        signal: Signal::Header("x-amzn-waf-action", "challenge"),
        source: "https://docs.aws.amazon.com/waf/latest/developerguide/waf-captcha-and-challenge-actions.html",
    },
    Signature {
        name: "cloudflare challenge",
        signal: Signal::Titled("Just a moment...", &["/cdn-cgi/challenge-platform/"]),
        source: "Cloudflare's interstitial as served: its title, and its script from /cdn-cgi/challenge-platform/",
    },
    Signature {
        name: "cloudflare challenge",
        signal: Signal::Titled("Just a moment...", &["challenges.cloudflare.com"]),
        source: "Cloudflare's Turnstile interstitial as served: its title, and its widget from challenges.cloudflare.com",
    },
    Signature {
        name: "cloudflare block",
        signal: Signal::Titled("Attention Required! | Cloudflare", &["cf-error-details"]),
        source: "Cloudflare's block page (error 1020 and the like) as served",
    },
    Signature {
        name: "akamai block",
        signal: Signal::Titled("Access Denied", &["Reference&#32;&#35;"]),
        source: "Akamai's deny page as served: \"Access Denied\" and a \"Reference #\" (entities kept)",
    },
    Signature {
        name: "perimeterx captcha",
        signal: Signal::Titled("Access to this page has been denied", &["px-captcha"]),
        source: "HUMAN (PerimeterX) block page as served: its title and the px-captcha element",
    },
    Signature {
        name: "datadome captcha",
        signal: Signal::Small(&["captcha-delivery.com", "var dd={"]),
        source: "DataDome's block page as served (titled with the site's name): its settings (var dd) and its script from captcha-delivery.com",
    },
];

/// The block the table finds in a body's `window`, if any.
fn built_in_body(window: &[u8], whole: usize) -> Option<Block> {
    let holds = |markers: &[&str]| {
        markers
            .iter()
            .all(|m| memmem::find(window, m.as_bytes()).is_some())
    };
    let title = title(window);
    let row = SIGNATURES.iter().find(|s| match s.signal {
        Signal::Header(..) => false,
        Signal::Titled(wanted, markers) => {
            title.is_some_and(|t| same_title(t, wanted)) && holds(markers)
        }
        Signal::Small(markers) => whole <= SMALL_PAGE && holds(markers),
    })?;
    Some(Block::built_in(row.name, "body"))
}

/// The document's title: the text of its first `<title>` (any case), if it ends within the
/// window and is at most [`MAX_TITLE_BYTES`].
fn title(window: &[u8]) -> Option<&[u8]> {
    let open = memchr::memchr_iter(b'<', window).find(|&at| {
        let tag = window.get(at + 1..at + 7);
        tag.is_some_and(|t| t[..5].eq_ignore_ascii_case(b"title") && matches!(t[5], b'>' | b' '))
    })?;
    let text_at = open + memchr::memchr(b'>', &window[open..])? + 1;
    let rest = &window[text_at..window.len().min(text_at + MAX_TITLE_BYTES + 1)];
    let end = memchr::memchr(b'<', rest)?;
    Some(&rest[..end])
}

/// Whether a title is the table's: trimmed, ASCII case ignored, a final `.` or `…` dropped.
fn same_title(title: &[u8], wanted: &str) -> bool {
    fn trimmed(t: &[u8]) -> &[u8] {
        let t = t.trim_ascii();
        let t = t.strip_suffix("\u{2026}".as_bytes()).unwrap_or(t);
        t.strip_suffix(b".").unwrap_or(t).trim_ascii_end()
    }
    trimmed(title).eq_ignore_ascii_case(trimmed(wanted.as_bytes()))
}

/// A search for all of a job's body patterns in one pass, leftmost match first. It uses
/// the packed (SIMD) search.
fn automaton<P: AsRef<[u8]>>(patterns: &[P]) -> AhoCorasick {
    AhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostFirst)
        .build(patterns)
        // Cannot fail: a few short literals are far under the automaton's limits.
        .expect("the signatures' automaton")
}

/// A job's name for one of its signatures, as reasons and logs show it.
pub type SignatureName = Bounded<64>;

/// A job's own signature. It is validated when the job is read, by
/// [`JobSignature::header`] or [`JobSignature::body`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSignature {
    name: SignatureName,
    signal: JobSignal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum JobSignal {
    /// A header (lowercase name) whose value contains this (lowercase).
    Header(String, String),
    /// Bytes the body's window must hold (case-sensitive).
    Body(Vec<u8>),
}

impl JobSignature {
    /// A header signature: `header` is a header's name (an HTTP token), and `contains` must
    /// be found in its value. ASCII case is ignored in both. `None` when either is empty,
    /// too long or not text.
    pub fn header(name: &str, header: &str, contains: &str) -> Option<Self> {
        let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
        let valid = (1..=MAX_PATTERN_BYTES).contains(&header.len())
            && header.bytes().all(token)
            && (1..=MAX_PATTERN_BYTES).contains(&contains.len())
            && contains.bytes().all(|c| (b' '..=b'~').contains(&c));
        valid.then(|| Self {
            name: signature_name(name, &header.to_ascii_lowercase()),
            signal: JobSignal::Header(header.to_ascii_lowercase(), contains.to_ascii_lowercase()),
        })
    }

    /// A body signature: bytes the body's window must hold, case-sensitive. `None` when the
    /// pattern is shorter than [`MIN_BODY_PATTERN_BYTES`] or longer than [`MAX_PATTERN_BYTES`].
    pub fn body(name: &str, pattern: &str) -> Option<Self> {
        let valid = (MIN_BODY_PATTERN_BYTES..=MAX_PATTERN_BYTES).contains(&pattern.len());
        valid.then(|| Self {
            name: signature_name(name, "body"),
            signal: JobSignal::Body(pattern.as_bytes().to_vec()),
        })
    }
}

/// A job signature's name. Where the job gave none, a name saying what it looks at.
fn signature_name(name: &str, looks_at: &str) -> SignatureName {
    let name = name.trim();
    let printable = name.chars().all(|c| !c.is_control());
    match (name.is_empty(), printable) {
        (false, true) => SignatureName::new(name),
        _ => SignatureName::new(&format!("job signature ({looks_at})")),
    }
}

/// How a job's pages are checked for blocks: on (the default) with the table and the job's
/// own signatures, or off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detection {
    off: bool,
    own: Option<Arc<Own>>,
}

/// A job's own signatures, with their body patterns in one automaton.
#[derive(Debug)]
struct Own {
    signatures: Vec<JobSignature>,
    bodies: Option<(AhoCorasick, Vec<usize>)>,
}

impl PartialEq for Own {
    fn eq(&self, other: &Self) -> bool {
        self.signatures == other.signatures
    }
}

impl Eq for Own {}

impl Detection {
    /// No detection: the job's pages are stored whatever they are.
    pub fn off() -> Self {
        Self {
            off: true,
            own: None,
        }
    }

    /// The table and `signatures`. Signatures past [`MAX_JOB_SIGNATURES`] are dropped.
    pub fn with(mut signatures: Vec<JobSignature>) -> Self {
        signatures.truncate(MAX_JOB_SIGNATURES);
        if signatures.is_empty() {
            return Self::default();
        }
        let (body_rows, patterns): (Vec<usize>, Vec<&[u8]>) = (signatures.iter().enumerate())
            .filter_map(|(row, s)| match &s.signal {
                JobSignal::Body(bytes) => Some((row, bytes.as_slice())),
                JobSignal::Header(..) => None,
            })
            .unzip();
        let bodies = (!patterns.is_empty()).then(|| (automaton(&patterns), body_rows));
        let own = Own { signatures, bodies };
        Self {
            off: false,
            own: Some(Arc::new(own)),
        }
    }

    pub fn is_off(&self) -> bool {
        self.off
    }

    /// The block the response's headers show, if any. `header` looks up a header by its
    /// lowercase name. This check runs before the body is read.
    pub fn by_headers<'h>(&self, header: impl Fn(&str) -> Option<&'h str>) -> Option<Block> {
        if self.off {
            return None;
        }
        let built_in = SIGNATURES.iter().find_map(|s| match s.signal {
            Signal::Header(name, value) => header(name)
                .filter(|v| v.trim().eq_ignore_ascii_case(value))
                .map(|_| Block::built_in(s.name, name)),
            Signal::Titled(..) | Signal::Small(_) => None,
        });
        built_in.or_else(|| self.own_header(&header))
    }

    fn own_header<'h>(&self, header: &impl Fn(&str) -> Option<&'h str>) -> Option<Block> {
        let own = self.own.as_ref()?;
        own.signatures.iter().find_map(|s| match &s.signal {
            JobSignal::Header(name, contains) => header(name)
                .filter(|v| v.to_ascii_lowercase().contains(contains.as_str()))
                .map(|_| Block::own(&s.name, "job header")),
            JobSignal::Body(_) => None,
        })
    }

    /// The block a body shows, if any. Its first [`BODY_WINDOW`] bytes are checked against
    /// the table when it is HTML or has no type. They are checked against the job's own
    /// body patterns whatever its type.
    pub fn by_body(&self, content_type: Option<&str>, body: &[u8]) -> Option<Block> {
        if self.off {
            return None;
        }
        let window = &body[..body.len().min(BODY_WINDOW)];
        let html = is_html(content_type);
        let built_in = html.then(|| built_in_body(window, body.len())).flatten();
        built_in.or_else(|| self.own_body(window))
    }

    fn own_body(&self, window: &[u8]) -> Option<Block> {
        let own = self.own.as_ref()?;
        let (automaton, rows) = own.bodies.as_ref()?;
        let hit = automaton.find(window)?;
        let row = rows[hit.pattern().as_usize()];
        Some(Block::own(&own.signatures[row].name, "job body"))
    }
}

/// Whether a response of this `Content-Type` may be a bot manager's page: HTML, or no type.
fn is_html(content_type: Option<&str>) -> bool {
    content_type.is_none_or(is_html_type)
}

/// The start of the failure reason of a task that hit a block page.
pub const BLOCKED: &str = "blocked: ";

/// Whether a task's failure `reason` is a block page's.
pub fn is_block_reason(reason: &str) -> bool {
    reason.starts_with(BLOCKED)
}

/// A block a response showed: which signature, and where it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The table's name (`cloudflare challenge`), or the job's name for its own signature.
    pub name: SignatureName,
    /// A header's name or `body`. For a job's own signature: `job header` or `job body`.
    pub seen_in: &'static str,
}

impl Block {
    fn built_in(name: &str, seen_in: &'static str) -> Self {
        Self {
            name: SignatureName::new(name),
            seen_in,
        }
    }

    fn own(name: &SignatureName, seen_in: &'static str) -> Self {
        Self {
            name: name.clone(),
            seen_in,
        }
    }

    /// The task's failure reason: `blocked: cloudflare challenge (cf-mitigated)`.
    pub fn reason(&self) -> String {
        format!("{BLOCKED}{self}")
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.seen_in)
    }
}

/// The table alone, for a fetch that no job's settings apply to.
pub static TABLE_ONLY: Detection = Detection {
    off: false,
    own: None,
};

/// No detection. Used for robots.txt, which is read as robots.txt whatever it looks like.
pub static NO_DETECTION: Detection = Detection {
    off: true,
    own: None,
};

/// The statuses bot managers send their pages with, besides 2xx. Only bodies with these
/// statuses are read for signatures. A 404's body is not.
pub const BLOCK_STATUSES: [u16; 4] = [403, 405, 429, 503];

#[cfg(test)]
mod tests {
    use super::*;

    const CHALLENGE: &str = "<!DOCTYPE html><html><head><title>Just a moment...</title></head>\
        <body><script>var s='/cdn-cgi/challenge-platform/h/b/orchestrate/chl_page/v1';</script></body></html>";

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    #[test]
    fn every_row_of_the_table_names_its_source_and_body_rows_need_a_marker() {
        for signature in SIGNATURES {
            assert!(!signature.source.is_empty(), "{}", signature.name);
            let markers = match signature.signal {
                Signal::Header(..) => continue,
                Signal::Titled(_, markers) => markers.len(),
                Signal::Small(markers) => markers.len() - 1,
            };
            assert!(
                markers >= 1,
                "{}: a title or one word matches articles",
                signature.name
            );
        }
    }

    #[test]
    fn headers_are_checked_by_name_and_value_whatever_the_case_of_the_value() {
        let detection = Detection::default();
        let cases = [
            (
                &[("cf-mitigated", "challenge")][..],
                Some("cloudflare challenge (cf-mitigated)"),
            ),
            (
                &[("cf-mitigated", " Challenge ")],
                Some("cloudflare challenge (cf-mitigated)"),
            ),
            (
                &[("x-amzn-waf-action", "captcha")],
                Some("aws waf captcha (x-amzn-waf-action)"),
            ),
            (
                &[("x-amzn-waf-action", "challenge")],
                Some("aws waf challenge (x-amzn-waf-action)"),
            ),
            (&[("cf-ray", "8f1c2a3b4c5d6e7f-FRA")], None),
            (&[("cf-mitigated", "none")], None),
            (&[], None),
        ];
        for (pairs, expected) in cases {
            let block = detection.by_headers(headers(pairs)).map(|b| b.to_string());
            assert_eq!(block.as_deref(), expected, "{pairs:?}");
        }
    }

    #[test]
    fn a_body_is_a_block_only_with_every_pattern_of_a_row_and_only_as_html() {
        let detection = Detection::default();
        let article =
            "<title>Why scrapers see Just a moment...</title> /cdn-cgi/challenge-platform/";

        let block = detection.by_body(Some("text/html; charset=UTF-8"), CHALLENGE.as_bytes());
        assert_eq!(
            block.map(|b| b.reason()).as_deref(),
            Some("blocked: cloudflare challenge (body)")
        );
        assert!(
            detection.by_body(None, CHALLENGE.as_bytes()).is_some(),
            "no type: looked at"
        );
        assert_eq!(
            detection.by_body(Some("application/json"), CHALLENGE.as_bytes()),
            None
        );
        assert_eq!(
            detection.by_body(Some("text/html"), article.as_bytes()),
            None
        );
        let first_only = "<title>Just a moment...</title>";
        assert_eq!(
            detection.by_body(Some("text/html"), first_only.as_bytes()),
            None
        );
    }

    #[test]
    fn a_title_matches_whatever_its_case_spaces_and_final_dot_and_only_as_the_documents() {
        let detection = Detection::default();
        let page = |title: &str| {
            format!("<html><head><TITLE >{title}</TITLE></head><body>Reference&#32;&#35;18</body>")
        };
        let akamai = |title: &str| detection.by_body(None, page(title).as_bytes()).is_some();

        assert!(akamai("Access Denied"));
        assert!(akamai("  access denied. "));
        assert!(!akamai("Access Denied: a review"));
        let in_the_body = "<html><head><title>Shop</title></head><body><title>Access Denied</title>Reference&#32;&#35;";
        assert_eq!(
            detection.by_body(None, in_the_body.as_bytes()),
            None,
            "the first title only"
        );
        assert_eq!(
            detection.by_body(None, b"<title>Access Denied"),
            None,
            "a title that never ends"
        );
    }

    #[test]
    fn a_page_without_a_title_of_its_own_is_looked_for_in_small_bodies_only() {
        let detection = Detection::default();
        let datadome = "<html><head><title>shop.example</title></head><body><script>var dd={'host':'geo.captcha-delivery.com'}</script></body></html>";
        let mut large = datadome.as_bytes().to_vec();
        large.resize(SMALL_PAGE + 1, b' ');

        let small = detection.by_body(Some("text/html"), datadome.as_bytes());

        assert_eq!(
            small.map(|b| b.to_string()).as_deref(),
            Some("datadome captcha (body)")
        );
        assert_eq!(detection.by_body(Some("text/html"), &large), None);
    }

    #[test]
    fn only_the_bodys_first_window_is_read() {
        let detection = Detection::default();
        let mut late = vec![b' '; BODY_WINDOW];
        late.extend_from_slice(CHALLENGE.as_bytes());
        let mut straddling = vec![b' '; BODY_WINDOW - 40];
        straddling.extend_from_slice(CHALLENGE.as_bytes());

        assert_eq!(detection.by_body(Some("text/html"), &late), None);
        assert_eq!(
            detection.by_body(Some("text/html"), &straddling),
            None,
            "its second pattern is past the window"
        );
    }

    #[test]
    fn a_jobs_own_signatures_add_to_the_table_and_detection_off_sees_nothing() {
        let own = Detection::with(vec![
            JobSignature::body("login wall", "id=\"login-wall\"").unwrap(),
            JobSignature::header("", "X-Shop-Block", "Yes").unwrap(),
        ]);
        let wall = br#"<form id="login-wall">"#;

        let by_body = own.by_body(Some("application/octet-stream"), wall);
        let by_header = own.by_headers(headers(&[("x-shop-block", "yes, rate")]));
        let table = own.by_headers(headers(&[("cf-mitigated", "challenge")]));

        assert_eq!(
            by_body.map(|b| b.to_string()).as_deref(),
            Some("login wall (job body)")
        );
        assert_eq!(
            by_header.map(|b| b.to_string()).as_deref(),
            Some("job signature (x-shop-block) (job header)")
        );
        assert!(table.is_some(), "the table still applies");
        let off = Detection::off();
        assert_eq!(
            off.by_headers(headers(&[("cf-mitigated", "challenge")])),
            None
        );
        assert_eq!(off.by_body(Some("text/html"), CHALLENGE.as_bytes()), None);
    }

    #[test]
    fn a_jobs_signature_is_refused_when_empty_too_short_too_long_or_not_a_header_name() {
        let long = "x".repeat(MAX_PATTERN_BYTES + 1);
        assert!(
            JobSignature::body("a", "short").is_none(),
            "under 8 bytes matches real pages"
        );
        assert!(JobSignature::body("a", &long).is_none());
        assert!(
            JobSignature::header("a", "x-a b", "v").is_none(),
            "a space is no token"
        );
        assert!(JobSignature::header("a", "x-a", "").is_none());
        assert!(
            JobSignature::header("a", "x-a", "caf\u{e9}").is_none(),
            "header values are ASCII"
        );
        assert!(JobSignature::header("a", &long, "v").is_none());
        let named = JobSignature::body(&"n".repeat(500), "login-wall").unwrap();
        assert!(named.name.len() <= 64, "a name is bounded");
        let many = (0..20).map(|i| JobSignature::body("a", &format!("pattern-{i:02}")).unwrap());
        let kept = Detection::with(many.collect());
        let late = kept.by_body(None, b"pattern-19");
        assert_eq!(late, None, "past the eighth, dropped");
    }
}
