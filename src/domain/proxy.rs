//! Proxy egress: the proxy tiers that `PROXY_URLS` lists, their credentials (from Secrets
//! Manager, never logged), and which proxy of a tier a host sticks to for a session.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use url::Url;

pub use crate::domain::spend::MAX_TIERS;

/// The most proxies one tier may list.
pub const MAX_PER_TIER: usize = 64;

/// One proxy: `http://host:port` or `https://host:port`, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyAddr {
    url: Url,
    /// `host:port`, built once, because every fetch compares and hashes it.
    label: String,
}

impl ProxyAddr {
    /// A proxy URL from `PROXY_URLS`. Credentials in it are refused: they belong in the
    /// secret. No error quotes the entry. Whatever it holds, such as a credential or a token
    /// in a path or query, may be a secret written in the wrong place.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let url = Url::parse(raw.trim()).map_err(|e| format!("does not parse as a URL ({e})"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err("holds credentials: keep them in PROXY_SECRET_ARN".into());
        }
        if !matches!(url.scheme(), "http" | "https") {
            // A scheme is letters, digits and `+-.`: safe to name.
            return Err(format!("is a {} proxy, not http or https", url.scheme()));
        }
        let bare = matches!(url.path(), "" | "/") && url.query().is_none();
        if url.host_str().is_none() || !bare || url.fragment().is_some() {
            return Err("is not scheme://host:port (a path, query or fragment)".into());
        }
        let host = url.host_str().unwrap_or_default();
        let label = format!("{host}:{}", url.port_or_known_default().unwrap_or_default());
        Ok(Self { url, label })
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    /// `host:port`: how logs and the secret name this proxy.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The host the proxy's client resolves (IPv6 without brackets). `None` for a literal.
    pub fn name(&self) -> Option<&str> {
        match self.url.host()? {
            url::Host::Domain(name) => Some(name),
            _ => None,
        }
    }
}

/// What a tier's proxies mark (`PROXY_MARKS`, one word a tier). It says who made an answer
/// to an `http` target that came back without a mark the tier would add.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Marks {
    /// `forwarded`: they add `Via` to every answer they forward (RFC 9110 asks it; tinyproxy
    /// and Squid do by default). An answer without it is their own. The default.
    #[default]
    Forwarded,
    /// `errors`: they mark nothing they forward, and their own errors at most with a
    /// `Proxy-Status` naming them (RFC 9209). An anonymous pool. An unmarked answer is the
    /// site's, but a 407.
    Errors,
}

impl Marks {
    fn parse(word: &str) -> Result<Self, String> {
        match word.trim() {
            "" | "forwarded" => Ok(Self::Forwarded),
            "errors" => Ok(Self::Errors),
            _ => Err(format!("{:?} is not forwarded or errors", word.trim())),
        }
    }
}

/// The ordered tiers of `PROXY_URLS`: `;` between tiers, `,` between the proxies of one.
/// Each tier also has its [`Marks`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tiers {
    proxies: Vec<Vec<ProxyAddr>>,
    marks: Vec<Marks>,
}

impl Tiers {
    /// The tiers, each marking what it forwards (the default [`Marks`]).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut tiers = Vec::new();
        for tier in raw.split(';').filter(|t| !t.trim().is_empty()) {
            let proxies = tier
                .split(',')
                .filter(|p| !p.trim().is_empty())
                .enumerate()
                .map(|(i, raw)| {
                    ProxyAddr::parse(raw)
                        .map_err(|why| format!("tier {}, proxy {}: {why}", tiers.len() + 1, i + 1))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if proxies.is_empty() || proxies.len() > MAX_PER_TIER {
                return Err(format!(
                    "a tier lists no proxy, or more than {MAX_PER_TIER}"
                ));
            }
            tiers.push(proxies);
        }
        if tiers.len() > MAX_TIERS {
            return Err(format!("more than {MAX_TIERS} tiers"));
        }
        let marks = vec![Marks::default(); tiers.len()];
        Ok(Self {
            proxies: tiers,
            marks,
        })
    }

    /// The tiers with the marks of `PROXY_MARKS`: a word a tier, `;` between them, in tier
    /// order. An empty word, or a tier past the list's end, keeps the default. More words
    /// than tiers is an error.
    pub fn marked(mut self, raw: &str) -> Result<Self, String> {
        let words: Vec<&str> = match raw.trim() {
            "" => Vec::new(),
            raw => raw.split(';').collect(),
        };
        if words.len() > self.proxies.len() {
            return Err(format!(
                "{} words for {} tiers",
                words.len(),
                self.proxies.len()
            ));
        }
        for (i, word) in words.into_iter().enumerate() {
            self.marks[i] = Marks::parse(word).map_err(|why| format!("tier {}: {why}", i + 1))?;
        }
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// How many tiers there are.
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Tier `tier` (1-based) and its proxies.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[ProxyAddr])> {
        self.proxies
            .iter()
            .enumerate()
            .map(|(i, p)| (i + 1, p.as_slice()))
    }

    /// What tier `tier` (1-based) marks. The default for a tier there is not.
    pub fn marks(&self, tier: usize) -> Marks {
        let at = tier.checked_sub(1).and_then(|i| self.marks.get(i));
        at.copied().unwrap_or_default()
    }
}

/// The user name and password of a proxy. Neither is ever printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

/// The secret that `PROXY_SECRET_ARN` names, a JSON object. `username` and `password` apply
/// to every proxy. `tiers` gives a tier's credentials: a list in tier order, with `null` to
/// skip a tier. `proxies` gives one proxy's, keyed by `host:port`. The most specific wins. A
/// proxy that none of them covers gets no credentials.
#[derive(Clone, Default)]
pub struct ProxySecret {
    all: Option<Credentials>,
    tiers: Vec<Option<Credentials>>,
    proxies: HashMap<String, Credentials>,
}

/// The secret as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    username: Option<String>,
    password: Option<String>,
    #[serde(default)]
    tiers: Vec<Option<Credentials>>,
    #[serde(default)]
    proxies: HashMap<String, Credentials>,
}

impl fmt::Debug for ProxySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProxySecret(<redacted>)")
    }
}

impl ProxySecret {
    /// Reads the secret's string. The error never quotes it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let written: Written = serde_json::from_str(text).map_err(|e| {
            format!(
                "the proxy secret is not the JSON object docs/proxies.md describes ({:?} at line {}, column {})",
                e.classify(),
                e.line(),
                e.column()
            )
        })?;
        let all = match (written.username, written.password) {
            (Some(username), Some(password)) => Some(Credentials { username, password }),
            (None, None) => None,
            _ => {
                return Err(
                    "the proxy secret has a username without a password, or the reverse".into(),
                );
            }
        };
        Ok(Self {
            all,
            tiers: written.tiers,
            proxies: written.proxies,
        })
    }

    /// The credentials of `proxy` in `tier` (1-based), if any.
    pub fn for_proxy(&self, tier: usize, proxy: &ProxyAddr) -> Option<&Credentials> {
        let tier = tier.checked_sub(1).and_then(|i| self.tiers.get(i));
        self.proxies
            .get(proxy.label())
            .or(tier.and_then(Option::as_ref))
            .or(self.all.as_ref())
    }
}

/// The proxy of a tier that a host uses now. Every sandbox picks the same one for a whole
/// session, by rendezvous hashing of host, proxy and session. So a site sees one address per
/// session, and its cookies and rate limits line up. Each host's sessions end at a moment of
/// its own.
pub fn sticky<P: Borrow<ProxyAddr>>(
    host: &str,
    proxies: &[P],
    now: SystemTime,
    session: Duration,
) -> usize {
    let seconds = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let length = session.as_secs().max(1);
    let offset = score(&[host.as_bytes()]) % length;
    let window = (seconds + offset) / length;
    let window = window.to_be_bytes();
    (0..proxies.len())
        .max_by_key(|&i| {
            let label = proxies[i].borrow().label();
            score(&[host.as_bytes(), label.as_bytes(), &window])
        })
        .unwrap_or(0)
}

fn score(parts: &[&[u8]]) -> u64 {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut first = [0_u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_split_on_semicolons_and_proxies_on_commas() {
        let tiers = Tiers::parse("http://dc1:3128, http://dc2:3128;https://resi:8000").unwrap();

        let labels: Vec<Vec<&str>> = tiers
            .iter()
            .map(|(_, proxies)| proxies.iter().map(ProxyAddr::label).collect())
            .collect();
        assert_eq!(labels, [vec!["dc1:3128", "dc2:3128"], vec!["resi:8000"]]);
        assert!(Tiers::parse("").unwrap().is_empty());
    }

    #[test]
    fn proxy_urls_with_credentials_or_paths_are_refused_without_echoing_them() {
        let err = Tiers::parse("http://user:hunter2@dc1:3128").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(Tiers::parse("socks5://dc1:1080").is_err());
        assert!(Tiers::parse("http://dc1:3128/path").is_err());
        assert!(Tiers::parse("http://dc1:3128;,").is_err());
        assert!(Tiers::parse("http://a:1;http://b:1;http://c:1;http://d:1;http://e:1").is_err());
    }

    #[test]
    fn each_tier_marks_what_it_forwards_unless_proxy_marks_says_otherwise() {
        let tiers = || Tiers::parse("http://dc1:3128;http://resi:8000;http://m:1").unwrap();

        let old = tiers().marked("").unwrap();
        let some = tiers().marked(" ;errors").unwrap();

        assert_eq!(old, tiers(), "an old config, without PROXY_MARKS");
        assert_eq!(
            (1..=4).map(|t| old.marks(t)).collect::<Vec<_>>(),
            [Marks::Forwarded; 4]
        );
        assert_eq!(
            (1..=3).map(|t| some.marks(t)).collect::<Vec<_>>(),
            [Marks::Forwarded, Marks::Errors, Marks::Forwarded]
        );
        assert!(tiers().marked("errors;errors;errors;errors").is_err());
        let err = tiers().marked("forwarded;via").unwrap_err();
        assert!(err.starts_with("tier 2: \"via\""), "{err}");
    }

    /// Entries that hold `s3cr` where a secret might be written by mistake.
    pub(crate) const LEAKY_PROXY_URLS: [&str; 10] = [
        "socks5://user-s3cr:pw-s3cr@dc1:1080",
        "http://user-s3cr:pw-s3cr@dc1:3128",
        "http://pw-s3cr@dc1:3128",
        "http://dc1:3128/path-s3cr",
        "http://dc1:3128/?token=s3cr",
        "http://dc1:3128#s3cr",
        "http//user-s3cr:pw-s3cr@dc1",
        "https://[user-s3cr",
        "pw-s3cr",
        "http://dc1:99999/s3cr",
    ];

    #[test]
    fn no_error_of_a_malformed_proxy_url_quotes_any_part_of_it() {
        for leaky in LEAKY_PROXY_URLS {
            for raw in [
                leaky.to_owned(),
                format!("http://ok:3128, {leaky};https://b:1"),
            ] {
                let err = Tiers::parse(&raw).expect_err(&raw.replace("s3cr", "*"));

                assert!(!err.contains("s3cr"), "{err}");
                assert!(err.starts_with("tier 1, proxy "), "{err}");
            }
        }
    }

    #[test]
    fn the_most_specific_credentials_win_and_none_are_ever_printed() {
        let secret = ProxySecret::parse(
            r#"{"username":"all","password":"p0",
                "tiers":[null,{"username":"t2","password":"p2"}],
                "proxies":{"resi:8000":{"username":"one","password":"p3"}}}"#,
        )
        .unwrap();
        let dc = ProxyAddr::parse("http://dc1:3128").unwrap();
        let resi = ProxyAddr::parse("http://resi:8000").unwrap();
        let other = ProxyAddr::parse("http://resi2:8000").unwrap();

        let user = |tier, proxy| secret.for_proxy(tier, proxy).map(|c| c.username.as_str());
        assert_eq!(user(1, &dc), Some("all"));
        assert_eq!(user(2, &other), Some("t2"));
        assert_eq!(user(2, &resi), Some("one"));
        assert!(!format!("{secret:?}{:?}", secret.for_proxy(1, &dc)).contains("p0"));
        for bad in [
            r#"{"username": 7, "password": "s3cret"}"#,
            r#"{"username": "u", "pasword": "s3cret"}"#,
            r#"{"password": "s3cret"}"#,
            r#"{"proxies": {"dc1:3128": {"username": "u"}}, "password": "s3cret"}"#,
        ] {
            let err = ProxySecret::parse(bad).unwrap_err();
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn a_host_sticks_to_one_proxy_for_a_session_and_hosts_spread() {
        let proxies: Vec<ProxyAddr> = (0..8)
            .map(|i| ProxyAddr::parse(&format!("http://dc{i}:3128")).unwrap())
            .collect();
        let session = Duration::from_secs(600);
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);

        let picks: Vec<usize> = (0..600)
            .map(|s| sticky("shop.example", &proxies, at(1_000_000 + s), session))
            .collect();
        let changes = picks.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(changes <= 1, "one session boundary at most: {changes}");
        let mut used = std::collections::HashSet::new();
        for host in 0..64 {
            used.insert(sticky(
                &format!("h{host}.example"),
                &proxies,
                at(0),
                session,
            ));
        }
        assert!(used.len() >= 6, "hosts spread over the tier: {used:?}");
        assert_eq!(sticky("a", &proxies[..1], at(0), session), 0);
    }
}
