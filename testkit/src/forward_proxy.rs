//! A real forward proxy for the tests: tinyproxy (Debian's `tinyproxy-bin`, installed by
//! `make test`), on 127.0.0.1, connecting out from its own loopback address (as a proxy
//! pool's egress address), with basic auth if asked. It marks what it forwards with `Via`,
//! as tinyproxy does by default; errors of its own carry none. Stopped when dropped.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// The user and password of a proxy started with credentials.
pub const USER: &str = "conveyor";
pub const PASSWORD: &str = "proxy-secret-7f3a";

pub struct ForwardProxy {
    pub addr: SocketAddr,
    /// The address its connections to sites come from.
    pub egress: IpAddr,
    dir: tempfile::TempDir,
    _child: Child,
}

impl ForwardProxy {
    /// A proxy on 127.0.0.1 whose connections come from `egress`, asking for [`USER`] and
    /// [`PASSWORD`] when `auth`.
    pub async fn start(egress: IpAddr, auth: bool) -> Self {
        Self::start_on([127, 0, 0, 1].into(), egress, auth).await
    }

    /// As [`ForwardProxy::start`], listening on `listen`.
    pub async fn start_on(listen: IpAddr, egress: IpAddr, auth: bool) -> Self {
        Self::start_with(listen, egress, auth, "").await
    }

    /// As [`ForwardProxy::start`], a proxy that hides itself: what it forwards carries no
    /// `Via` (an anonymous proxy).
    pub async fn start_hidden(egress: IpAddr) -> Self {
        let hidden = "DisableViaHeader Yes\n";
        Self::start_with([127, 0, 0, 1].into(), egress, false, hidden).await
    }

    async fn start_with(listen: IpAddr, egress: IpAddr, auth: bool, more: &str) -> Self {
        for _ in 0..5 {
            if let Some(proxy) = Self::try_start(listen, egress, auth, more).await {
                return proxy;
            }
        }
        panic!("tinyproxy did not start: is it installed? `make test` installs it");
    }

    async fn try_start(listen: IpAddr, egress: IpAddr, auth: bool, more: &str) -> Option<Self> {
        let port = free_port(listen).await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("log");
        let mut conf = format!(
            "Port {port}\nListen {listen}\nBind {egress}\nTimeout 30\nMaxClients 256\n\
             LogLevel Connect\nLogFile \"{}\"\n{more}",
            log.display()
        );
        if auth {
            conf.push_str(&format!("BasicAuth {USER} {PASSWORD}\n"));
        }
        let path = dir.path().join("tinyproxy.conf");
        std::fs::write(&path, conf).expect("write the proxy's configuration");
        let mut child = Command::new(tinyproxy())
            .arg("-d")
            .arg("-c")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("run tinyproxy: is it installed? `make test` installs it");
        let addr = SocketAddr::new(listen, port);
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Some(Self {
                    addr,
                    egress,
                    dir,
                    _child: child,
                });
            }
            if child.try_wait().ok().flatten().is_some() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// `http://<address>:<port>`, as `PROXY_URLS` names it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests the proxy logged (`GET http://...`, `CONNECT host:port`), in order.
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        log.lines()
            .filter_map(|line| line.split_once("): ").map(|(_, request)| request))
            .filter(|request| request.starts_with("GET ") || request.starts_with("CONNECT "))
            .map(str::to_owned)
            .collect()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }
}

/// tinyproxy on the PATH, or where `TINYPROXY` says.
fn tinyproxy() -> String {
    std::env::var("TINYPROXY").unwrap_or_else(|_| "tinyproxy".into())
}

async fn free_port(ip: IpAddr) -> u16 {
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind a port to learn a free one");
    listener
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}
