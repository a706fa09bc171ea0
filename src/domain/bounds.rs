//! Bounded text. Every value that comes from a page, a header or a URL is cut to a fixed
//! size before it is written to S3 or DynamoDB. So no write can fail for its size, and the
//! task item stays small. That matters because every guard read pays for the whole item.

use std::fmt;
use std::ops::Deref;

use sha2::{Digest, Sha256};

/// At most `MAX` bytes of UTF-8. A longer value keeps its start and ends with a marker that
/// names its full length and the start of its SHA-256, e.g.
/// `text/html; x=aaaa...[cut: 9000 bytes, sha256 3a7bd3e2360a3d29]`. The marker is ASCII,
/// so an ASCII value (a URL, a header) stays ASCII.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Bounded<const MAX: usize>(String);

/// A response's `Content-Type`. S3 sends it back as a header, and S3 refuses request
/// headers over 8 KB in total. Real media types are far shorter.
pub type ContentType = Bounded<512>;
/// Whether a `Content-Type` value names HTML (`text/html` or XHTML), whatever its
/// parameters.
pub fn is_html_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("text/html")
        || essence.eq_ignore_ascii_case("application/xhtml+xml")
}

/// The URL a page ended at, after redirects. Browsers and CDNs stop at about 8 KB. 2 KB
/// keeps the task item small.
pub type UrlText = Bounded<2048>;
/// A URL in S3 user metadata. S3 caps user metadata at 2 KB for all keys and values
/// together. An object has two such URLs, next to its SHA-256, its validators and where it
/// was refreshed from.
pub type MetadataUrl = Bounded<560>;
/// Why a task failed, as written on the task.
pub type Reason = Bounded<1024>;

impl<const MAX: usize> Bounded<MAX> {
    /// `value` as it is when it fits, else cut with the marker.
    pub fn new(value: &str) -> Self {
        if value.len() <= MAX {
            return Self(value.to_owned());
        }
        let digest = hex::encode(&Sha256::digest(value.as_bytes())[..8]);
        let marker = format!("...[cut: {} bytes, sha256 {digest}]", value.len());
        let mut end = MAX.saturating_sub(marker.len());
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        Self(format!("{}{marker}", &value[..end]))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const MAX: usize> Deref for Bounded<MAX> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const MAX: usize> fmt::Display for Bounded<MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<const MAX: usize> From<&str> for Bounded<MAX> {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl<const MAX: usize> From<String> for Bounded<MAX> {
    fn from(value: String) -> Self {
        if value.len() <= MAX {
            Self(value)
        } else {
            Self::new(&value)
        }
    }
}

impl<const MAX: usize> PartialEq<&str> for Bounded<MAX> {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_value_that_fits_is_kept_as_it_is() {
        assert_eq!(Bounded::<16>::new("text/html"), "text/html");
        assert_eq!(Bounded::<9>::new("text/html"), "text/html");
    }

    #[test]
    fn a_long_value_is_cut_to_the_bound_with_its_length_and_hash() {
        let long = format!("text/html; x={}", "a".repeat(9000));

        let cut = ContentType::new(&long);

        assert_eq!(cut.len(), 512);
        assert!(cut.starts_with("text/html; x=aaa"));
        assert!(cut.ends_with(&format!(
            "...[cut: {} bytes, sha256 {}]",
            long.len(),
            &hex::encode(Sha256::digest(long.as_bytes()))[..16]
        )));
    }

    proptest! {
        #[test]
        fn any_value_fits_its_bound_on_a_char_boundary(value in ".{0,3000}") {
            let cut = Reason::new(&value);
            prop_assert!(cut.len() <= 1024);
            prop_assert!(value.starts_with(cut.split("...[cut: ").next().unwrap_or_default()));
            if value.is_ascii() {
                prop_assert!(cut.is_ascii());
            }
        }
    }
}
