//! A task's redirects. Each hop is a request of its own host, so the worker follows them
//! itself, one turn at a time. This file holds where a chain of hops has led, what a copy
//! of the message carries of it, and the rule for the next hop.

use serde_json::{Map, Value};

/// The longest URL fetched: longer ones fail for good (browsers and CDNs stop near 8 KB).
pub const MAX_URL_BYTES: usize = 8 * 1024;

/// The most redirects `MAX_REDIRECTS` may allow. It keeps a copy that carries its chain of
/// hops well under SQS's 256 KiB (21 URLs of at most 8 KiB).
pub const MOST_REDIRECTS: usize = 20;

/// Where a task's redirects have led so far. A copy carries it (the body's `hops` field),
/// so the task goes on from there when its copy comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hops {
    /// The URL to fetch next.
    pub next: String,
    /// The URLs fetched before it in this chain, the task's own first. Its length is the
    /// redirects followed so far.
    pub before: Vec<String>,
    /// Fetch `next` in full, without the earlier result's validators: a `304` to them did
    /// not confirm them.
    pub in_full: bool,
}

/// A redirect past the limit: the task fails for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("more than {0} redirects")]
pub struct TooManyRedirects(pub usize);

/// The body field that carries the chain.
pub(super) const HOPS: &str = "hops";

impl Hops {
    /// The chain after `fetched` answered with a redirect to `to`. `chain` is where the
    /// chain stood (none: `fetched` is the task's own URL). Past `most` redirects, counted
    /// across copies, there is no next hop.
    pub fn redirected(
        chain: Option<&Hops>,
        fetched: &str,
        to: &str,
        most: usize,
    ) -> Result<Hops, TooManyRedirects> {
        let mut before = chain.map(|c| c.before.clone()).unwrap_or_default();
        before.push(fetched.to_owned());
        if before.len() > most {
            return Err(TooManyRedirects(most));
        }
        Ok(Hops {
            next: to.to_owned(),
            before,
            in_full: false,
        })
    }

    /// The chain after a `304` to `fetched` that did not confirm the validators sent: the
    /// same URL again, in full. It is not a redirect, so it adds no hop.
    pub fn in_full(chain: Option<&Hops>, fetched: &str) -> Hops {
        Hops {
            next: fetched.to_owned(),
            before: chain.map(|c| c.before.clone()).unwrap_or_default(),
            in_full: true,
        }
    }

    /// The chain a body carries. Anything that is not a well-formed chain within the bounds
    /// (URL length, [`MOST_REDIRECTS`]) reads as none: the task starts at its own URL.
    pub(super) fn of(fields: &Map<String, Value>) -> Option<Hops> {
        let chain = fields.get(HOPS)?.as_object()?;
        let url = |value: &Value| {
            let text = value.as_str()?;
            (text.len() <= MAX_URL_BYTES).then(|| text.to_owned())
        };
        let before = chain.get("before").and_then(Value::as_array)?;
        if before.len() > MOST_REDIRECTS {
            return None;
        }
        Some(Hops {
            next: url(chain.get("next")?)?,
            before: before.iter().map(url).collect::<Option<_>>()?,
            in_full: chain.get("in_full").and_then(Value::as_bool) == Some(true),
        })
    }

    /// The chain as a body field.
    pub(super) fn to_value(&self) -> Value {
        serde_json::json!({
            "next": self.next,
            "before": self.before,
            "in_full": self.in_full,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: Value) -> Option<Hops> {
        let mut fields = Map::new();
        fields.insert(HOPS.into(), value);
        Hops::of(&fields)
    }

    #[test]
    fn each_redirect_adds_the_url_it_left_and_the_limit_counts_the_whole_chain() {
        let first = Hops::redirected(None, "http://a/1", "http://b/2", 2).unwrap();
        let second = Hops::redirected(Some(&first), "http://b/2", "http://c/3", 2).unwrap();
        let third = Hops::redirected(Some(&second), "http://c/3", "http://d/4", 2);

        assert_eq!(first.before, ["http://a/1"]);
        assert_eq!(second.next, "http://c/3");
        assert_eq!(second.before, ["http://a/1", "http://b/2"]);
        assert_eq!(third, Err(TooManyRedirects(2)));
    }

    #[test]
    fn a_fetch_in_full_goes_to_the_same_url_and_adds_no_hop() {
        let chain = Hops::redirected(None, "http://a/1", "http://b/2", 5).unwrap();

        let again = Hops::in_full(Some(&chain), "http://b/2");

        assert_eq!(again.next, "http://b/2");
        assert_eq!(again.before, ["http://a/1"]);
        assert!(again.in_full);
    }

    #[test]
    fn a_chain_reads_as_it_was_written_and_a_malformed_one_as_none() {
        let chain = Hops::redirected(None, "http://a/1", "http://b/2", 5).unwrap();
        let long = "x".repeat(MAX_URL_BYTES + 1);
        let many = vec![Value::from("http://a/"); MOST_REDIRECTS + 1];

        assert_eq!(read(chain.to_value()), Some(chain));
        assert_eq!(read(serde_json::json!("http://b/2")), None);
        assert_eq!(read(serde_json::json!({"next": 7, "before": []})), None);
        assert_eq!(read(serde_json::json!({"next": "http://b/"})), None);
        assert_eq!(read(serde_json::json!({"next": long, "before": []})), None);
        assert_eq!(
            read(serde_json::json!({"next": "http://b/", "before": many})),
            None
        );
    }
}
