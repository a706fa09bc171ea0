//! What a response through a proxy means, based on who made it. It may be the site's own
//! response, a block the next tier may get past, or the proxy's own failure (our failure,
//! never the page's). This file also sorts out requests the proxy did not answer, by
//! hyper-util's tunnel error.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;

use super::{FetchError, Retry, classify};
use crate::domain::proxy::{Marks, ProxyAddr};

/// hyper-util's error for a CONNECT tunnel that did not open. Its module is private, so the
/// type is named through the tunnel's `Service` impl; reqwest builds its tunnels with the
/// same hyper-util (one version in Cargo.lock), so the error it boxes is this type.
type TunnelError = <Tunnel<HttpConnector> as tower_service::Service<http::Uri>>::Error;

/// Who made an answer that came back through a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Maker {
    /// The site: inside a CONNECT tunnel, or marked as forwarded, with `Via` (RFC 9110
    /// 7.6.3) or a `Proxy-Status` with `received-status`. A site may send those itself; they
    /// only make its answer its own.
    Site,
    /// The proxy itself: an answer without `Via` through a tier whose proxies add it to what
    /// they forward ([`Marks::Forwarded`]), or a `Proxy-Status` whose last member (the
    /// proxy nearest us, RFC 9209 2) names the proxy with an `error`, through a tier that
    /// marks only its own errors ([`Marks::Errors`]).
    Proxy,
    /// Unmarked, through a tier that marks nothing it forwards: read as the site's, but for
    /// a 407.
    Unmarked,
}

/// Who made an answer, by its headers, whether it came through a tunnel, and what the
/// `proxy` it came through marks.
pub(super) fn maker(
    headers: &reqwest::header::HeaderMap,
    tunnelled: bool,
    (proxy, marks): (&ProxyAddr, Marks),
) -> Maker {
    if tunnelled {
        return Maker::Site;
    }
    let said = proxy_status(headers);
    let forwarded = headers.contains_key(reqwest::header::VIA)
        || said
            .iter()
            .any(|(_, params)| params.contains_key("received-status"));
    let last = said.last().filter(|(name, _)| names(name, proxy));
    let own_error = last.is_some_and(|(_, params)| params.contains_key("error"));
    match (marks, forwarded) {
        (_, true) => Maker::Site,
        (Marks::Forwarded, false) => Maker::Proxy,
        (Marks::Errors, false) if own_error => Maker::Proxy,
        (Marks::Errors, false) => Maker::Unmarked,
    }
}

/// The members of an answer's `Proxy-Status` (RFC 9209), in order: each one's name and
/// parameters. A header that does not parse, and an inner list, say nothing.
fn proxy_status(headers: &reqwest::header::HeaderMap) -> Vec<(String, sfv::Parameters)> {
    headers
        .get_all("proxy-status")
        .iter()
        .filter_map(|value| sfv::Parser::new(value.as_bytes()).parse::<sfv::List>().ok())
        .flatten()
        .filter_map(|member| match member {
            sfv::ListEntry::Item(item) => {
                let name = match &item.bare_item {
                    sfv::BareItem::Token(token) => token.as_str().to_owned(),
                    sfv::BareItem::String(text) => text.as_str().to_owned(),
                    _ => String::new(),
                };
                Some((name, item.params))
            }
            sfv::ListEntry::InnerList(_) => None,
        })
        .collect()
}

/// Whether a `Proxy-Status` member's name is `proxy`'s: its host, or its `host:port`, in
/// any case and with or without the root's trailing dot.
fn names(name: &str, proxy: &ProxyAddr) -> bool {
    let host = proxy.url().host_str().unwrap_or_default();
    let bare = |text: &str| text.trim_end_matches('.').to_ascii_lowercase();
    let (name, host) = (bare(name), bare(host));
    !name.is_empty() && (name == host || name == proxy.label().to_ascii_lowercase())
}

/// Classifies a response that came through the proxy, by who made it. A 401 (tinyproxy's
/// answer to wrong credentials) or a 502, 503 or 504 without `Retry-After` that the proxy
/// made is its own failure. So is a 407 the site is not shown to have made: a 407 asks for
/// the proxy's credentials (RFC 9110 15.5.8), and a wrong secret must show as ours rather
/// than fail a run's pages. These are our failures, never the page's. A 403, or a 429
/// without `Retry-After`, is a block the next tier may get past.
pub(super) fn answered(err: FetchError, maker: Maker) -> FetchError {
    let status = err.http_status.unwrap_or_default();
    let paced = err.retry_after.is_some();
    let proxy = maker == Maker::Proxy;
    match status {
        403 => FetchError {
            blocked: true,
            ..err
        },
        429 if !paced => FetchError {
            blocked: true,
            ..err
        },
        401 if proxy => ours_to_authenticate(status),
        407 if maker != Maker::Site => ours_to_authenticate(status),
        502..=504 if proxy && !paced => FetchError {
            retry: Retry::Ours,
            reason: format!("proxy: gateway failure ({})", err.reason),
            ..err
        },
        _ => err,
    }
}

/// The proxy refused our credentials (a 401 or 407 it made).
fn ours_to_authenticate(status: u16) -> FetchError {
    FetchError {
        http_status: Some(status),
        ..FetchError::ours(format!("proxy: authentication required (HTTP {status})"))
    }
}

/// A request through the proxy that got no answer. The three cases are: a CONNECT answered
/// with 407; a CONNECT refused otherwise (the proxy could not or would not connect, treated
/// as a block); and no connection to the proxy at all (the next tier may be up).
/// tests/it/proxies.rs holds each case against a real proxy.
pub(super) fn transport_failure(
    err: &reqwest::Error,
    proxy: &ProxyAddr,
    tunnelled: bool,
) -> FetchError {
    let label = proxy.label();
    let no_connection = FetchError {
        blocked: true,
        ..FetchError::ours(format!("proxy {label}: no connection"))
    };
    match tunnel_error(err) {
        Some(TunnelError::ProxyAuthRequired) => FetchError {
            http_status: Some(407),
            ..FetchError::ours(format!("proxy {label}: authentication required (HTTP 407)"))
        },
        Some(TunnelError::TunnelUnsuccessful) => FetchError {
            blocked: true,
            ..FetchError::ours(format!("proxy {label}: CONNECT refused"))
        },
        Some(TunnelError::ConnectFailed(_)) if !err.is_timeout() => no_connection,
        None if err.is_connect() && !tunnelled && !err.is_timeout() => no_connection,
        _ => classify::classify_error(err),
    }
}

/// The tunnel error among an error's sources, if a CONNECT failed.
fn tunnel_error(err: &reqwest::Error) -> Option<&TunnelError> {
    let mut current = std::error::Error::source(err);
    while let Some(e) = current {
        if let Some(tunnel) = e.downcast_ref::<TunnelError>() {
            return Some(tunnel);
        }
        current = e.source();
    }
    None
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
            (403, None, Proxy, Retry::Permanent, true),
            (403, None, Site, Retry::Permanent, true),
            (429, None, Unmarked, Retry::Transient, true),
            (429, Some(5), Proxy, Retry::Transient, false),
            (407, None, Proxy, Retry::Ours, false),
            (407, None, Unmarked, Retry::Ours, false),
            (401, None, Proxy, Retry::Ours, false),
            (401, None, Unmarked, Retry::Permanent, false),
            (401, None, Site, Retry::Permanent, false),
            (502, None, Proxy, Retry::Ours, false),
            (503, None, Proxy, Retry::Ours, false),
            (504, None, Proxy, Retry::Ours, false),
            (502, None, Unmarked, Retry::Transient, false),
            (503, None, Unmarked, Retry::Transient, false),
            (503, Some(5), Proxy, Retry::Transient, false),
            (503, None, Site, Retry::Transient, false),
            (404, None, Proxy, Retry::Permanent, false),
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

    fn with(pairs: &[(&'static str, &'static str)]) -> reqwest::header::HeaderMap {
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, reqwest::header::HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn a_proxy_that_marks_what_it_forwards_made_only_what_it_did_not_mark() {
        let proxy = ProxyAddr::parse("http://gw.example:3128").expect("a proxy URL");
        let cases = [
            (with(&[]), false, Maker::Proxy),
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
                with(&[("proxy-status", "gw.example; error=destination_unavailable")]),
                false,
                Maker::Proxy,
            ),
            // The site's own Proxy-Status, through the proxy, whatever it names.
            (
                with(&[
                    ("via", "1.1 gw"),
                    ("proxy-status", "x; error=destination_unavailable"),
                ]),
                false,
                Maker::Site,
            ),
            (
                with(&[
                    ("via", "1.1 gw"),
                    ("proxy-status", "gw.example; error=connection_refused"),
                ]),
                false,
                Maker::Site,
            ),
        ];
        for (headers, tunnelled, expected) in cases {
            let made = maker(&headers, tunnelled, (&proxy, Marks::Forwarded));
            assert_eq!(made, expected, "{headers:?}");
        }
    }

    #[test]
    fn a_proxy_that_marks_only_its_errors_made_what_its_own_proxy_status_names() {
        let proxy = ProxyAddr::parse("http://gw.example:3128").expect("a proxy URL");
        let cases = [
            (with(&[]), false, Maker::Unmarked),
            (with(&[]), true, Maker::Site),
            (with(&[("via", "1.1 cdn")]), false, Maker::Site),
            (
                with(&[("proxy-status", "x; error=destination_unavailable")]),
                false,
                Maker::Unmarked,
            ),
            (
                with(&[("proxy-status", "gw.example; error=destination_unavailable")]),
                false,
                Maker::Proxy,
            ),
            (
                with(&[("proxy-status", r#""GW.Example."; error=dns_timeout"#)]),
                false,
                Maker::Proxy,
            ),
            (
                with(&[("proxy-status", "gw.example:3128; error=dns_timeout")]),
                false,
                Maker::Proxy,
            ),
            (
                with(&[
                    ("proxy-status", "cdn; error=x"),
                    ("proxy-status", "gw.example; error=y"),
                ]),
                false,
                Maker::Proxy,
            ),
            (
                with(&[("proxy-status", "gw.example; error=y, cdn; error=x")]),
                false,
                Maker::Unmarked,
            ),
            (
                with(&[("proxy-status", "gw.example; received-status=503")]),
                false,
                Maker::Site,
            ),
            (
                with(&[("proxy-status", r#"edge; details="gw.example; error=x""#)]),
                false,
                Maker::Unmarked,
            ),
        ];
        for (headers, tunnelled, expected) in cases {
            let made = maker(&headers, tunnelled, (&proxy, Marks::Errors));
            assert_eq!(made, expected, "{headers:?}");
        }
    }
}
