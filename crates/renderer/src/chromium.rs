//! One Chromium per warm sandbox: started with every way around the browser proxy closed, driven over
//! the DevTools protocol (chromiumoxide), and killed with all its processes.
//!
//! The browser runs in a process group of its own, so a kill reaches its renderer and utility
//! processes too, and none outlives the invocation that ended it. Its flags leave the
//! browser proxy as its only way out:
//!
//! - every page's context names a browser proxy of its own; the browser's default proxy is
//!   one that refuses everything (`refuse_all`);
//! - `<-loopback>` undoes Chromium's habit of sending loopback and link-local addresses
//!   around any proxy (on Lambda, the Runtime API listens on loopback);
//! - the browser resolves no name itself (`--host-resolver-rules`): DNS prefetch, WebRTC and
//!   anything else that would look a name up find nothing, and the browser proxy resolves each
//!   request's name as the plain fetch does;
//! - QUIC is off (it would be UDP, which no HTTP proxy carries), and WebRTC may send no UDP
//!   that does not go through the proxy, which is none;
//! - background networking, component updates, sync, crash reports and field trials are off.
//!
//! `file://`, `chrome://` and downloads are closed per page ([`crate::render`]).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use chromiumoxide::cdp::browser_protocol::browser::BrowserContextId;
use chromiumoxide::cdp::browser_protocol::target::{
    CreateBrowserContextParams, CreateTargetParams,
};
use chromiumoxide::{Browser, Page};
use futures_util::StreamExt;
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::task::JoinHandle;

/// How a browser is started.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The browser's executable (`CHROMIUM_PATH`).
    pub executable: PathBuf,
    /// The most time the browser may take to start and open its DevTools endpoint.
    pub timeout: Duration,
    /// The most memory one page's JavaScript heap may take, in MiB (V8's old space).
    pub heap_mib: u32,
}

/// Why a browser could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("could not start the browser: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("the browser did not open its DevTools endpoint within {0:?}")]
    NoEndpoint(Duration),
    #[error("could not connect to the browser: {0}")]
    Connect(#[from] chromiumoxide::error::CdpError),
}

/// A running browser: its process group, its DevTools connection, and its profile folder.
pub struct Chromium {
    browser: Browser,
    /// Locked only to ask whether it has exited.
    child: std::sync::Mutex<Child>,
    group: Option<Pid>,
    events: JoinHandle<()>,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Chromium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chromium")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// A page in a fresh incognito context of its own, whose every request goes through `proxy`.
pub struct Tab {
    pub page: Page,
    context: BrowserContextId,
}

impl Chromium {
    /// Starts the browser, its default proxy `refuse_all`, and connects to it.
    pub async fn launch(
        launch: &Launch,
        refuse_all: std::net::SocketAddr,
    ) -> Result<Self, LaunchError> {
        let profile = tempfile::Builder::new()
            .prefix("conveyor-chromium-")
            .tempdir()?;
        let mut child = Command::new(&launch.executable)
            .args(flags(launch, refuse_all, &profile))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let group = child.id().and_then(|id| Pid::from_raw(id as i32));
        // The pipe is taken once, here, and spawn() was asked for it: it is there.
        let stderr = child.stderr.take().expect("stderr is piped");
        let endpoint = tokio::time::timeout(launch.timeout, endpoint(stderr)).await;
        let connected = match endpoint {
            Ok(Some(url)) => Browser::connect(url).await.map_err(LaunchError::from),
            _ => Err(LaunchError::NoEndpoint(launch.timeout)),
        };
        let (browser, mut handler) = match connected {
            Ok(connected) => connected,
            Err(err) => {
                kill(group, &mut child).await;
                return Err(err);
            }
        };
        let events = tokio::spawn(async move { while handler.next().await.is_some() {} });
        Ok(Self {
            browser,
            child: std::sync::Mutex::new(child),
            group,
            events,
            _profile: profile,
        })
    }

    /// A fresh incognito context whose requests go through `proxy`, and a blank page in it.
    pub async fn tab(
        &self,
        proxy: std::net::SocketAddr,
    ) -> Result<Tab, chromiumoxide::error::CdpError> {
        let context = CreateBrowserContextParams::builder()
            .dispose_on_detach(true)
            .proxy_server(format!("http://{proxy}"))
            .proxy_bypass_list("<-loopback>")
            .build();
        let context = self.browser.create_browser_context(context).await?;
        let target = CreateTargetParams::builder()
            .url("about:blank")
            .browser_context_id(context.clone())
            .build()
            .map_err(chromiumoxide::error::CdpError::msg)?;
        match self.browser.new_page(target).await {
            Ok(page) => Ok(Tab { page, context }),
            Err(err) => {
                let _ = self.browser.dispose_browser_context(context).await;
                Err(err)
            }
        }
    }

    /// Closes `tab`'s page and disposes of its context (its cookies, storage and workers).
    pub async fn close(&self, tab: Tab) {
        let _ = tab.page.close().await;
        let _ = self.browser.dispose_browser_context(tab.context).await;
    }

    /// The browser's DevTools connection, for commands to the browser itself.
    pub fn browser(&self) -> &Browser {
        &self.browser
    }

    /// Whether the browser's main process still runs and its connection is open.
    pub fn alive(&self) -> bool {
        let running = |child: &mut Child| matches!(child.try_wait(), Ok(None));
        // A poisoned lock only means a panic while it was held: the child is still there.
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        !self.events.is_finished() && running(&mut child)
    }

    /// The browser's process group (its main process's id).
    pub fn group(&self) -> Option<i32> {
        self.group.map(|g| g.as_raw_nonzero().get())
    }

    /// The memory the browser's processes hold (their resident sets), in bytes.
    pub fn resident_bytes(&self) -> u64 {
        self.group.map_or(0, |group| {
            crate::procs::resident_bytes(group.as_raw_nonzero().get())
        })
    }

    /// Kills the browser and every process of its group, and reaps its main process.
    pub async fn kill(mut self) {
        self.events.abort();
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        kill(self.group.take(), child).await;
    }
}

impl Drop for Chromium {
    /// A browser dropped without [`Chromium::kill`] (a panic, a cancelled task) still takes its
    /// processes with it; the runtime reaps the main one.
    fn drop(&mut self) {
        self.events.abort();
        if let Some(group) = self.group.take() {
            let _ = kill_process_group(group, Signal::KILL);
        }
    }
}

async fn kill(group: Option<Pid>, child: &mut Child) {
    if let Some(group) = group {
        let _ = kill_process_group(group, Signal::KILL);
    }
    let _ = child.kill().await;
}

/// The DevTools endpoint the browser writes to its stderr when it is ready. The rest of
/// its stderr is read on (a full pipe would stall the browser) and logged at debug level.
async fn endpoint(stderr: ChildStderr) -> Option<String> {
    const READY: &str = "DevTools listening on ";
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(url) = line.strip_prefix(READY) {
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "chromium", "{line}");
                }
            });
            return Some(url.trim().to_owned());
        }
    }
    None
}

/// The browser's command line (the module's comment says why each way out is closed).
fn flags(
    launch: &Launch,
    refuse_all: std::net::SocketAddr,
    profile: &tempfile::TempDir,
) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--no-zygote",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-breakpad",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-field-trial-config",
        "--metrics-recording-only",
        "--mute-audio",
        "--hide-scrollbars",
        "--disable-quic",
        "--dns-prefetch-disable",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-bypass-list=<-loopback>",
        "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,\
         NetworkPrediction,AutofillServerCommunication,HttpsUpgrades,\
         HttpsFirstBalancedModeAutoEnable,CertificateTransparencyComponentUpdater",
        "--remote-debugging-port=0",
    ]
    .map(str::to_owned)
    .into();
    flags.push(format!("--proxy-server=http://{refuse_all}"));
    flags.push(format!(
        "--js-flags=--max-old-space-size={}",
        launch.heap_mib
    ));
    flags.push(format!("--user-data-dir={}", profile.path().display()));
    flags.push("about:blank".to_owned());
    flags
}
