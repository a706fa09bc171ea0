//! A refresh is a task that knows its earlier result, stored by the run it refreshes. It
//! asks the site whether the page changed since, with an RFC 9110 conditional request. On
//! "304 Not Modified" it carries the earlier object forward instead of paying for the page
//! again.
//!
//! Every file of the refresh feature: here (the rule); the task's earlier result read in
//! `store/dynamo/tasks/mod.rs` (port `ports/tasks.rs`) and `worker/guard.rs`; the
//! conditional request in `scraper/egress.rs` and `scraper/fetcher.rs`; the earlier object
//! checked and carried forward in `worker/fetch/mod.rs`, `worker/converge/` and
//! `store/s3.rs` (port `ports/results.rs`); a refresh run made by `crates/ops/src/submit.rs` and
//! `store/dynamo/runs/`.

use crate::domain::ids::ResultKey;

/// The longest entity tag kept and sent back. Real ones are a hash or two long.
pub const MAX_ETAG: usize = 192;
/// The longest `Last-Modified` kept: an HTTP-date is 29 characters.
pub const MAX_LAST_MODIFIED: usize = 40;

/// An entity tag as a site sent it in `ETag`, strong (`"xyz"`) or weak (`W/"xyz"`). It
/// follows the grammar of RFC 9110 (8.8.3) in visible ASCII, and is at most [`MAX_ETAG`]
/// bytes. So it is safe to send back in `If-None-Match`, and to keep in a task item and in
/// an object's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ETag(String);

impl ETag {
    /// `raw` if it is one entity tag within the bounds, else `None`.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        let opaque = raw.strip_prefix("W/").unwrap_or(raw);
        let inner = opaque.strip_prefix('"')?.strip_suffix('"')?;
        let etagc = |b: u8| b == 0x21 || (0x23..=0x7e).contains(&b);
        (raw.len() <= MAX_ETAG && inner.bytes().all(etagc)).then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tag without its weak marker (`W/`). The weak comparison of RFC 9110 (8.8.3.2)
    /// compares this, and `If-None-Match` uses that comparison.
    fn opaque(&self) -> &str {
        self.0.strip_prefix("W/").unwrap_or(&self.0)
    }

    /// Weak comparison: the same opaque tag, weak or not.
    pub fn weakly_matches(&self, other: &Self) -> bool {
        self.opaque() == other.opaque()
    }
}

/// A `Last-Modified` value as a site sent it: an HTTP-date (RFC 9110 5.6.7) of at most
/// [`MAX_LAST_MODIFIED`] bytes. It is kept exactly as sent, because it goes back unchanged
/// as `If-Modified-Since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastModified(String);

impl LastModified {
    /// `raw` if it is an HTTP-date within the bounds, else `None`.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        let visible = raw.bytes().all(|b| (0x20..=0x7e).contains(&b));
        let valid = raw.len() <= MAX_LAST_MODIFIED && visible;
        (valid && httpdate::parse_http_date(raw).is_ok()).then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a response said to recognise its representation by later.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validators {
    pub etag: Option<ETag>,
    pub last_modified: Option<LastModified>,
}

impl Validators {
    /// From the raw header values (each dropped if it is not valid).
    pub fn parse(etag: Option<&str>, last_modified: Option<&str>) -> Self {
        Self {
            etag: etag.and_then(ETag::parse),
            last_modified: last_modified.and_then(LastModified::parse),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.etag.is_none() && self.last_modified.is_none()
    }

    /// Whether a 304 that says `answered` confirms the representation these validators
    /// name. They were sent as `If-None-Match` and `If-Modified-Since`. A validator the 304
    /// carries must be the one sent. An entity tag is compared weakly, since RFC 9111 4.3.4
    /// selects the stored response by it. A validator the 304 leaves out is not checked. A
    /// 304 that names an entity tag when none was sent refers to some other representation.
    pub fn confirmed_by(&self, answered: &Self) -> bool {
        let etag = match (&self.etag, &answered.etag) {
            (Some(sent), Some(said)) => sent.weakly_matches(said),
            (None, Some(_)) => false,
            (_, None) => true,
        };
        let date = match (&self.last_modified, &answered.last_modified) {
            (Some(sent), Some(said)) => sent == said || self.etag.is_some(),
            _ => true,
        };
        etag && date
    }
}

/// A lowercase hex SHA-256, as a producer names an earlier result's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sha256Hex(String);

impl Sha256Hex {
    pub fn parse(raw: &str) -> Option<Self> {
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        (raw.len() == 64 && raw.bytes().all(hex)).then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a refresh task knows of its earlier result: the object and its SHA-256, and the
/// validators of the response it was stored from (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prior {
    pub key: ResultKey,
    pub sha256: Sha256Hex,
    pub validators: Validators,
}

impl Prior {
    /// The earlier result as a producer wrote it on the task, if it is whole and valid: a
    /// key, a SHA-256, and a validator to ask with.
    pub fn of((key, sha256): (Option<&str>, Option<&str>), validators: Validators) -> Option<Self> {
        let key = key.filter(|k| !k.is_empty() && k.len() <= 1024)?;
        let sha256 = Sha256Hex::parse(sha256?)?;
        (!validators.is_empty()).then(|| Self {
            key: ResultKey::from_stored(key.to_owned()),
            sha256,
            validators,
        })
    }

    /// Whether its object is one of the results under `prefix`. No other object may be
    /// carried forward.
    pub fn is_under(&self, prefix: &str) -> bool {
        self.key.as_str().starts_with(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entity_tag_is_kept_only_as_rfc_9110_writes_it() {
        for good in [r#""abc""#, r#"W/"abc""#, r#""""#, r#""a-b_c:1/2""#] {
            assert_eq!(ETag::parse(good).map(|e| e.0), Some(good.to_owned()));
        }
        let long = format!("\"{}\"", "a".repeat(MAX_ETAG));
        for bad in [
            "abc",
            "\"abc",
            "\"a\"b\"",
            "\"a\r\nX-Injected: 1\"",
            "\"a\u{0}\"",
            "\"caf\u{e9}\"",
            "w/\"abc\"",
            long.as_str(),
        ] {
            assert_eq!(ETag::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_last_modified_is_kept_only_when_it_is_an_http_date() {
        let good = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(LastModified::parse(good).map(|d| d.0), Some(good.into()));
        for bad in [
            "yesterday",
            "Sun, 06 Nov 1994 08:49:37 GMT\r\nX-Injected: 1",
            "Sun, 06 Nov 1994 08:49:37 GMT\u{7f}",
            "",
        ] {
            assert_eq!(LastModified::parse(bad), None, "{bad:?}");
        }
    }

    fn sent(etag: Option<&str>, date: Option<&str>) -> Validators {
        Validators::parse(etag, date)
    }

    #[test]
    fn a_304_confirms_what_was_sent_weakly_and_nothing_it_contradicts() {
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let later = "Mon, 07 Nov 1994 08:49:37 GMT";
        let cases = [
            (sent(Some(r#""a""#), None), sent(Some(r#""a""#), None), true),
            (
                sent(Some(r#""a""#), None),
                sent(Some(r#"W/"a""#), None),
                true,
            ),
            (sent(Some(r#""a""#), None), sent(None, None), true),
            (
                sent(Some(r#""a""#), None),
                sent(Some(r#""b""#), None),
                false,
            ),
            (sent(None, Some(date)), sent(None, Some(date)), true),
            (sent(None, Some(date)), sent(None, Some(later)), false),
            (
                sent(None, Some(date)),
                sent(Some(r#""a""#), Some(date)),
                false,
            ),
            (sent(None, Some(date)), sent(None, None), true),
            (
                sent(Some(r#""a""#), Some(date)),
                sent(Some(r#""a""#), Some(later)),
                true,
            ),
        ];
        for (sent, answered, confirmed) in cases {
            assert_eq!(
                sent.confirmed_by(&answered),
                confirmed,
                "{sent:?} {answered:?}"
            );
        }
    }

    #[test]
    fn a_prior_needs_a_key_a_sha256_and_a_validator_and_is_carried_from_the_results_only() {
        let sha = "a".repeat(64);
        let etag = || sent(Some(r#""a""#), None);
        let of = |key, sha: &str, validators| Prior::of((Some(key), Some(sha)), validators);

        assert!(of("results/j/r/t", &sha, etag()).is_some_and(|p| p.is_under("results/")));
        assert!(of("elsewhere/j/r/t", &sha, etag()).is_some_and(|p| !p.is_under("results/")));
        assert!(of("", &sha, etag()).is_none());
        assert!(of("results/j/r/t", "not-hex", etag()).is_none());
        assert!(of("results/j/r/t", &"A".repeat(64), etag()).is_none());
        assert!(of("results/j/r/t", &sha, Validators::default()).is_none());
    }
}
