//! The browser proxy: a forward proxy on loopback through which the browser makes every
//! connection (Chromium's `--proxy-server`). Each request names its target: `CONNECT
//! host:port` (HTTPS, and WebSockets, which Chromium tunnels) or an absolute `http://` URL.
//! The target is checked as the plain fetch checks a URL (`scraper::policy`): scheme, port,
//! credentials, and every address its name resolves to; one refused address refuses the
//! name. The connection goes to an address that was checked, so the name is not resolved
//! again between the check and the connection (no DNS rebinding). A redirect is the
//! browser's next request through the browser proxy, so it is checked the same way. A refused
//! request is answered `403`, counted, and nothing is sent to its target.
//!
//! The browser proxy also bounds what one render may ask for ([`Bounds`]): past its requests, a
//! request is refused; past its bytes, a new request is refused and a body or tunnel on its
//! way is cut. Either way [`Counts::over`] says so, for the renderer to stop the page.
//!
//! With an [`Upstream`] (the render's proxy tier), every allowed request goes on through
//! that proxy, with its credentials: a tunnel by the proxy's own `CONNECT`, a plain request
//! in absolute form. The target is still checked here first, and the proxy itself is never
//! a target. When the proxy gives no connection, refuses a tunnel or asks for credentials,
//! [`Counts::proxy_failed`] says so: the renderer then blames the proxy, not the site, as
//! the plain fetch does. Which tier a render goes through is the fetcher's choice.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, PROXY_AUTHORIZATION};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tower_service::Service;
use url::{Host, Url};

use conveyor_worker::scraper::policy::{AddressPolicy, Lookup};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// What the browser proxy let through and refused, and the bytes it carried.
#[derive(Debug, Default)]
pub struct Counts {
    pub allowed: AtomicU64,
    pub refused: AtomicU64,
    /// Bytes both ways through tunnels, as they go, and of forwarded responses' bodies.
    pub bytes: AtomicU64,
    /// Requests refused or bytes cut for the render's bounds: the page asked for too much.
    pub over: AtomicU64,
    /// The upstream proxy's first failure to give a connection, if it failed.
    pub proxy_failed: OnceLock<ProxyFailure>,
}

/// How the upstream proxy failed a request of the browser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyFailure {
    /// No connection to the proxy.
    NoConnection,
    /// The proxy answered a `CONNECT` with an error.
    TunnelRefused,
    /// The proxy asked for credentials (`407`).
    AuthRequired,
}

/// The most one render may ask for through the browser proxy.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub requests: u64,
    pub bytes: u64,
}

/// A proxy every allowed request goes on through, and its `Proxy-Authorization`.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub proxy: SocketAddr,
    pub authorization: Option<HeaderValue>,
}

/// The browser proxy's rules: which targets may be reached, how names resolve, how much, and
/// through which proxy (none: straight to the site).
#[derive(Clone)]
pub struct Rules {
    pub policy: Arc<AddressPolicy>,
    pub lookup: Arc<dyn Lookup>,
    pub bounds: Bounds,
    pub via: Option<Upstream>,
}

impl Counts {
    /// Takes one of the render's `most` requests; `false` when they are used up.
    fn take_request(&self, most: u64) -> bool {
        let taken = self
            .allowed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used < most).then_some(used + 1)
            });
        taken.is_ok()
    }

    /// Counts `n` bytes carried; `false` once they pass `most`.
    fn carried(&self, n: usize, most: u64) -> bool {
        let total = self.bytes.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        let within = total <= most;
        if !within {
            self.over.fetch_add(1, Ordering::Relaxed);
        }
        within
    }
}

/// A browser proxy listening on a loopback port; it stops when dropped.
pub struct BrowserProxy {
    addr: SocketAddr,
    counts: Arc<Counts>,
    serving: tokio::task::JoinHandle<()>,
}

impl BrowserProxy {
    /// Listens on an ephemeral port of 127.0.0.1.
    pub async fn start(rules: Rules) -> io::Result<Self> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let serving = tokio::spawn(serve(listener, rules, Arc::clone(&counts)));
        Ok(Self {
            addr,
            counts,
            serving,
        })
    }

    /// Where the browser's `--proxy-server` points.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }
}

impl Drop for BrowserProxy {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

/// Serves each connection of the browser on a task of its own.
async fn serve(listener: TcpListener, rules: Rules, counts: Arc<Counts>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors, say: a pause, not a spin.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let (rules, counts) = (rules.clone(), Arc::clone(&counts));
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, rules.clone(), Arc::clone(&counts)));
            let connection = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "a browser connection to the browser proxy ended");
            }
        });
    }
}

/// One request of the browser: checked, then tunnelled or forwarded, or refused.
async fn handle(
    req: Request<Incoming>,
    rules: Rules,
    counts: Arc<Counts>,
) -> Result<Response<Body>, hyper::Error> {
    let bounds = rules.bounds;
    if counts.bytes.load(Ordering::Relaxed) > bounds.bytes {
        return Ok(over(
            &counts,
            format!("the render's {} bytes are used up", bounds.bytes),
        ));
    }
    let target = match target_of(&req) {
        Ok(url) => url,
        Err(why) => return Ok(refuse(&counts, why)),
    };
    let addr = match checked_address(&rules, &target).await {
        Ok(addr) => addr,
        Err(why) => return Ok(refuse(&counts, why)),
    };
    if !counts.take_request(bounds.requests) {
        let why = format!("the render's {} requests are used up", bounds.requests);
        return Ok(over(&counts, why));
    }
    let site = match open(&rules, &req, &target, addr).await {
        Ok(site) => site,
        Err(Opening::Site) => return Ok(answer(StatusCode::BAD_GATEWAY, "no connection")),
        Err(Opening::Proxy(failure)) => {
            let _ = counts.proxy_failed.set(failure);
            return Ok(answer(
                StatusCode::BAD_GATEWAY,
                "the proxy gave no connection",
            ));
        }
    };
    if req.method() == Method::CONNECT {
        tunnel(req, site, counts, rules.bounds.bytes);
        return Ok(answer(StatusCode::OK, ""));
    }
    forward(req, site, &rules.via, counts, rules.bounds.bytes).await
}

/// Why a request got no connection: the site's address did not answer, or the upstream
/// proxy failed.
enum Opening {
    Site,
    Proxy(ProxyFailure),
}

/// No connection to the upstream proxy, whatever the error was.
fn no_connection<E>(_: E) -> Opening {
    Opening::Proxy(ProxyFailure::NoConnection)
}

/// The tunnel's error type, as hyper-util names it through its `Service` impl.
type TunnelError = <Tunnel<HttpConnector> as Service<Uri>>::Error;

/// The connection a request goes on by: to the site's checked address; through the
/// upstream proxy, a tunnel it opened to the target (a `CONNECT`) or a connection to it (a
/// plain request, sent on in absolute form).
async fn open(
    rules: &Rules,
    req: &Request<Incoming>,
    target: &Url,
    addr: SocketAddr,
) -> Result<TcpStream, Opening> {
    let Some(upstream) = &rules.via else {
        return TcpStream::connect(addr).await.map_err(|_| Opening::Site);
    };
    if req.method() != Method::CONNECT {
        return TcpStream::connect(upstream.proxy)
            .await
            .map_err(no_connection);
    }
    // An http proxy's address, and a target's host and port, always make a URI.
    let proxy: Uri = format!("http://{}", upstream.proxy)
        .parse()
        .map_err(no_connection)?;
    let mut tunnel = Tunnel::new(proxy, HttpConnector::new());
    if let Some(authorization) = &upstream.authorization {
        tunnel = tunnel.with_auth(authorization.clone());
    }
    let authority = target.host_str().zip(target.port_or_known_default());
    let (host, port) = authority.ok_or(Opening::Site)?;
    let dst: Uri = format!("https://{host}:{port}")
        .parse()
        .map_err(|_| Opening::Site)?;
    match Service::call(&mut tunnel, dst).await {
        Ok(opened) => Ok(opened.into_inner()),
        Err(TunnelError::ProxyAuthRequired) => Err(Opening::Proxy(ProxyFailure::AuthRequired)),
        Err(TunnelError::ConnectFailed(_)) => Err(Opening::Proxy(ProxyFailure::NoConnection)),
        Err(_) => Err(Opening::Proxy(ProxyFailure::TunnelRefused)),
    }
}

/// The URL a request names: `https://host:port/` for a `CONNECT`, else its absolute URI.
fn target_of(req: &Request<Incoming>) -> Result<Url, String> {
    if req.method() == Method::CONNECT {
        let authority = req.uri().authority().ok_or("a CONNECT without host:port")?;
        return Url::parse(&format!("https://{authority}/")).map_err(|e| e.to_string());
    }
    let url = Url::parse(&req.uri().to_string()).map_err(|_| "not an absolute URL")?;
    match url.scheme() {
        "http" => Ok(url),
        other => Err(format!(
            "{other}: only http is forwarded, the rest is tunnelled"
        )),
    }
}

/// The address to connect to: the URL passes the policy, and so does every address its
/// host resolves to.
async fn checked_address(rules: &Rules, url: &Url) -> Result<SocketAddr, String> {
    rules.policy.check_url(url).map_err(|r| r.to_string())?;
    let port = url.port_or_known_default().ok_or("no port")?;
    let ips = match url.host().ok_or("no host")? {
        Host::Ipv4(v4) => vec![v4.into()],
        Host::Ipv6(v6) => vec![v6.into()],
        Host::Domain(name) => (rules.lookup.lookup(name.to_owned()).await)
            .map_err(|e| format!("{name} does not resolve: {e}"))?,
    };
    if let Some(refused) = ips.iter().find_map(|&ip| rules.policy.check_ip(ip).err()) {
        return Err(refused.to_string());
    }
    let proxy = rules.via.as_ref().map(|upstream| upstream.proxy);
    if let Some(proxy) = proxy.filter(|p| ips.iter().any(|&ip| SocketAddr::new(ip, port) == *p)) {
        return Err(format!("{proxy} is the render's proxy, not a page"));
    }
    let ip = ips.first().ok_or("resolves to no address")?;
    Ok(SocketAddr::new(*ip, port))
}

/// Splices the browser's upgraded connection to the site's, counting the bytes as they go
/// and cutting the tunnel once the render's bytes are used up.
fn tunnel(req: Request<Incoming>, site: TcpStream, counts: Arc<Counts>, most: u64) {
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let mut browser = TokioIo::new(upgraded);
        let mut site = Metered {
            inner: site,
            counts,
            most,
        };
        let _ = tokio::io::copy_bidirectional(&mut browser, &mut site).await;
    });
}

/// A site's connection that counts the bytes read from it and written to it, and fails
/// once they pass the render's bound.
struct Metered {
    inner: TcpStream,
    counts: Arc<Counts>,
    most: u64,
}

impl Metered {
    fn count(&self, bytes: usize) -> io::Result<()> {
        match self.counts.carried(bytes, self.most) {
            true => Ok(()),
            false => Err(io::Error::other("the render's bytes are used up")),
        }
    }
}

impl AsyncRead for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        let got = buf.filled().len() - before;
        match read {
            Poll::Ready(Ok(())) => Poll::Ready(self.count(got)),
            other => other,
        }
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        match written {
            Poll::Ready(Ok(n)) => Poll::Ready(self.count(n).map(|()| n)),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Sends a plain HTTP request on to the site in origin form, and its answer back, cut once
/// the render's bytes are used up.
async fn forward(
    mut req: Request<Incoming>,
    site: TcpStream,
    via: &Option<Upstream>,
    counts: Arc<Counts>,
    most: u64,
) -> Result<Response<Body>, hyper::Error> {
    for name in ["proxy-connection", "proxy-authorization"] {
        req.headers_mut().remove(name);
    }
    match via {
        // The proxy takes the absolute form, with the tier's credentials.
        Some(upstream) => {
            if let Some(authorization) = &upstream.authorization {
                req.headers_mut()
                    .insert(PROXY_AUTHORIZATION, authorization.clone());
            }
        }
        None => {
            let origin_form = req.uri().path_and_query().map_or("/", |p| p.as_str());
            // The path of a URI hyper parsed is a URI itself: the default never applies.
            *req.uri_mut() = origin_form.parse().unwrap_or_default();
        }
    }
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake(TokioIo::new(site)).await
    else {
        return Ok(answer(StatusCode::BAD_GATEWAY, "the site did not answer"));
    };
    tokio::spawn(connection);
    let Ok(response) = sender.send_request(req).await else {
        return Ok(answer(StatusCode::BAD_GATEWAY, "the site did not answer"));
    };
    Ok(response.map(|body| {
        MeteredBody {
            inner: body,
            counts,
            most,
        }
        .boxed()
    }))
}

/// A forwarded response's body, counted frame by frame and cut once the render's bytes are
/// used up.
struct MeteredBody {
    inner: Incoming,
    counts: Arc<Counts>,
    most: u64,
}

impl hyper::body::Body for MeteredBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other.map(|end| end.map(|read| read.map_err(BoxError::from))),
        };
        let size = frame.data_ref().map_or(0, Bytes::len);
        match self.counts.carried(size, self.most) {
            true => Poll::Ready(Some(Ok(frame))),
            false => Poll::Ready(Some(Err("the render's bytes are used up".into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request refused for the render's bounds: counted as over them, and refused.
fn over(counts: &Counts, why: String) -> Response<Body> {
    counts.over.fetch_add(1, Ordering::Relaxed);
    refuse(counts, why)
}

/// A refused request: counted, answered `403` with the reason.
fn refuse(counts: &Counts, why: String) -> Response<Body> {
    counts.refused.fetch_add(1, Ordering::Relaxed);
    tracing::info!(why = %why, "the browser proxy refused a browser request");
    answer(
        StatusCode::FORBIDDEN,
        &format!("refused by the browser proxy: {why}"),
    )
}

fn answer(status: StatusCode, text: &str) -> Response<Body> {
    let body = Full::new(Bytes::from(text.to_owned()))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
}
