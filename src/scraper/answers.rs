//! What a response through a proxy means, based on who made it. It may be the site's own
//! response, a block the next tier may get past, or the proxy's own failure (our failure,
//! never the page's). This file also sorts out requests the proxy did not answer, using the
//! text hyper-util gives its tunnel errors.

use super::{FetchError, Retry, classify};
use crate::domain::proxy::ProxyAddr;

/// Who made an answer that came back through a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Maker {
    /// The site: inside a CONNECT tunnel, or forwarded by the proxy. A proxy marks what it
    /// forwards with `Via` (RFC 9110 7.6.3) or a `Proxy-Status` with `received-status`.
    Site,
    /// The proxy itself, shown by a `Proxy-Status` (RFC 9209) with an `error` of its own.
    Proxy,
    /// Unmarked: made by the proxy, or by the site through a proxy that hides itself.
    Unmarked,
}

/// Who made an answer, by its headers and whether it came through a tunnel.
pub(super) fn maker(headers: &reqwest::header::HeaderMap, tunnelled: bool) -> Maker {
    if tunnelled {
        return Maker::Site;
    }
    let said = headers
        .get_all("proxy-status")
        .iter()
        .filter_map(|value| sfv::Parser::new(value.as_bytes()).parse::<sfv::List>().ok())
        .flatten()
        .filter_map(|member| match member {
            sfv::ListEntry::Item(item) => Some(item.params),
            sfv::ListEntry::InnerList(_) => None,
        });
    let (mut error, mut received) = (false, false);
    for params in said {
        error |= params.contains_key("error");
        received |= params.contains_key("received-status");
    }
    match (
        error,
        received || headers.contains_key(reqwest::header::VIA),
    ) {
        (true, _) => Maker::Proxy,
        (false, true) => Maker::Site,
        (false, false) => Maker::Unmarked,
    }
}

/// Classifies a response that came through the proxy, by who made it. A 407, or a 401
/// (tinyproxy's answer to wrong credentials), that the site did not make is the proxy's own
/// failure. So is a 502, 503 or 504 without `Retry-After` that the site did not make. These
/// are our failures, never the page's. A 403, or a 429 without `Retry-After`, is a block the
/// next tier may get past.
pub(super) fn answered(err: FetchError, maker: Maker) -> FetchError {
    let status = err.http_status.unwrap_or_default();
    let paced = err.retry_after.is_some();
    let site = maker == Maker::Site;
    match status {
        403 => FetchError {
            blocked: true,
            ..err
        },
        429 if !paced => FetchError {
            blocked: true,
            ..err
        },
        401 | 407 if !site => FetchError {
            http_status: Some(status),
            ..FetchError::ours(format!("proxy: authentication required (HTTP {status})"))
        },
        502..=504 if !site && !paced => FetchError {
            retry: Retry::Ours,
            reason: format!("proxy: gateway failure ({})", err.reason),
            ..err
        },
        _ => err,
    }
}

/// A request through the proxy that got no answer. hyper-util does not export its tunnel
/// error type, so its three refusals are told apart by their error text. tests/it/proxies.rs
/// pins that text against a real proxy. The three cases are: a CONNECT answered with 407; a
/// CONNECT refused otherwise (the proxy could not or would not connect, treated as a block);
/// and no connection to the proxy at all (the next tier may be up).
pub(super) fn transport_failure(
    err: &reqwest::Error,
    proxy: &ProxyAddr,
    tunnelled: bool,
) -> FetchError {
    let text = chain(err);
    let label = proxy.label();
    if text.contains("tunnel error: proxy authorization required") {
        FetchError {
            http_status: Some(407),
            ..FetchError::ours(format!("proxy {label}: authentication required (HTTP 407)"))
        }
    } else if text.contains("tunnel error: unsuccessful") {
        FetchError {
            blocked: true,
            ..FetchError::ours(format!("proxy {label}: CONNECT refused"))
        }
    } else if (text.contains("tunnel error: failed to create underlying connection")
        || (err.is_connect() && !tunnelled))
        && !err.is_timeout()
    {
        FetchError {
            blocked: true,
            ..FetchError::ours(format!("proxy {label}: no connection"))
        }
    } else {
        classify::classify_error(err)
    }
}

/// An error and its sources, as one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut current = err.source();
    while let Some(e) = current {
        text.push_str(": ");
        text.push_str(&e.to_string());
        current = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;
    use std::time::Duration;

    fn at(status: u16, retry_after: Option<u64>) -> FetchError {
        FetchError {
            http_status: Some(status),
            retry_after: retry_after.map(Duration::from_secs),
            ..FetchError::new(
                classify::classify_status(StatusCode::from_u16(status).unwrap())
                    .unwrap_or(Retry::Permanent),
                format!("HTTP {status}"),
            )
        }
    }

    #[test]
    fn answers_through_a_proxy_follow_the_escalation_table() {
        use Maker::{Proxy, Site, Unmarked};
        // (status, Retry-After, maker) -> (retry, blocked)
        let table = [
            (403, None, Unmarked, Retry::Permanent, true),
            (403, None, Site, Retry::Permanent, true),
            (429, None, Unmarked, Retry::Transient, true),
            (429, Some(5), Unmarked, Retry::Transient, false),
            (407, None, Unmarked, Retry::Ours, false),
            (401, None, Unmarked, Retry::Ours, false),
            (401, None, Site, Retry::Permanent, false),
            (502, None, Unmarked, Retry::Ours, false),
            (503, None, Unmarked, Retry::Ours, false),
            (504, None, Proxy, Retry::Ours, false),
            (503, Some(5), Unmarked, Retry::Transient, false),
            (503, None, Site, Retry::Transient, false),
            (404, None, Unmarked, Retry::Permanent, false),
        ];
        for (status, after, maker, retry, blocked) in table {
            let err = answered(at(status, after), maker);
            assert_eq!(
                (err.retry, err.blocked),
                (retry, blocked),
                "{status} {after:?} {maker:?}"
            );
        }
    }

    #[test]
    fn a_proxy_marks_what_it_forwards_and_what_it_made() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = reqwest::header::HeaderMap::new();
            for (name, value) in pairs {
                headers.append(*name, reqwest::header::HeaderValue::from_static(value));
            }
            headers
        };
        let cases = [
            (with(&[]), false, Maker::Unmarked),
            (with(&[]), true, Maker::Site),
            (
                with(&[("via", "1.1 vm (tinyproxy/1.11.1)")]),
                false,
                Maker::Site,
            ),
            (
                with(&[("proxy-status", "edge; received-status=503")]),
                false,
                Maker::Site,
            ),
            (
                with(&[("proxy-status", "edge; error=destination_unavailable")]),
                false,
                Maker::Proxy,
            ),
            (
                with(&[("proxy-status", r#"edge; details="a, b; error=x""#)]),
                false,
                Maker::Unmarked,
            ),
            (
                with(&[
                    ("via", "1.1 cdn"),
                    ("proxy-status", "gw; error=connection_refused"),
                ]),
                false,
                Maker::Proxy,
            ),
        ];
        for (headers, tunnelled, expected) in cases {
            assert_eq!(maker(&headers, tunnelled), expected, "{headers:?}");
        }
    }
}
