//! A real rate-limited site for the tests: Debian's nginx (installed by `make test`) on a free
//! port of 127.0.0.1, serving small static pages under `limit_req` at N requests a second,
//! refusing the excess with a bare 429 (no `Retry-After`), and logging every answer's time
//! and status so a test can count 200s and 429s over time. Stopped when dropped.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// How long nginx may take to accept connections.
const START_WAIT: Duration = Duration::from_secs(5);
/// How many free ports are tried (another process may take one between our check and nginx).
const START_TRIES: usize = 5;

/// One request as nginx's access log has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// When nginx logged it (its `$msec`, once the answer was sent).
    pub at: SystemTime,
    pub status: u16,
    /// The request's path and query, as sent.
    pub path: String,
}

/// A running nginx whose pages are `/page/0` to `/page/{pages-1}`, plus `/robots.txt`
/// (allows all, never limited).
pub struct RateLimitedSite {
    port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl RateLimitedSite {
    /// nginx allowing `rate_per_s` requests a second from one address, `burst` more at once
    /// (answered at once: `nodelay`), the rest refused with 429.
    pub async fn start(rate_per_s: u32, burst: u32, pages: usize) -> Self {
        assert!(rate_per_s > 0, "nginx needs a rate of at least 1 r/s");
        let dir = tempfile::tempdir().expect("a temporary directory");
        write_pages(dir.path(), pages);
        let mut failure = String::new();
        for _ in 0..START_TRIES {
            let port = free_port();
            let conf = config(dir.path(), port, rate_per_s, burst);
            std::fs::write(dir.path().join("nginx.conf"), conf).expect("write nginx.conf");
            match try_start(dir.path(), port).await {
                Ok(child) => return Self { port, dir, child },
                Err(log) => failure = log,
            }
        }
        panic!("nginx did not start (is it installed? `make nginx` installs it):\n{failure}");
    }

    /// `http://127.0.0.1:<port><path>`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The URL of page `i`.
    pub fn page_url(&self, i: usize) -> String {
        self.url(&format!("/page/{i}"))
    }

    /// Its address (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Every answer but robots.txt's, in the order nginx logged them. nginx writes a line
    /// just after sending the answer: see [`RateLimitedSite::wait_answers`].
    pub fn answers(&self) -> Vec<Answer> {
        let all = self.all_answers();
        all.into_iter().filter(|a| !is_robots(&a.path)).collect()
    }

    /// Every answer, robots.txt's too.
    pub fn all_answers(&self) -> Vec<Answer> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines().filter_map(parse_line).collect()
    }

    /// [`RateLimitedSite::answers`] once there are at least `n` (or after 2 seconds): a
    /// client may read an answer a moment before nginx logs it.
    pub async fn wait_answers(&self, n: usize) -> Vec<Answer> {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let answers = self.answers();
            if answers.len() >= n || Instant::now() > until {
                return answers;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// nginx's error log (a refused request is logged there at `warn`, with its excess).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for RateLimitedSite {
    fn drop(&mut self) {
        // One process (master_process off): killing it leaves nothing behind.
        let _already_gone = self.child.kill();
        let _status = self.child.wait();
    }
}

/// The share of `answers` with `status` (0 when there are none).
pub fn share_of(answers: &[Answer], status: u16) -> f64 {
    if answers.is_empty() {
        return 0.0;
    }
    let hits = answers.iter().filter(|a| a.status == status).count();
    hits as f64 / answers.len() as f64
}

fn is_robots(path: &str) -> bool {
    path == "/robots.txt" || path.starts_with("/robots.txt?")
}

/// Spawns nginx on `dir`'s config and waits until `port` accepts connections. On failure,
/// its error log.
async fn try_start(dir: &Path, port: u16) -> Result<Child, String> {
    let error_log = dir.join("error.log");
    let mut child = Command::new(nginx())
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-e")
        .arg(&error_log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run nginx: is it installed? `make nginx` installs it");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let until = Instant::now() + START_WAIT;
    let outcome = loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            break format!("nginx exited: {status}");
        }
        if Instant::now() > until {
            break format!("port {port} did not open within {START_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let _already_gone = child.kill();
    let _status = child.wait();
    let log = std::fs::read_to_string(&error_log).unwrap_or_default();
    Err(format!("{outcome}; {}:\n{log}", error_log.display()))
}

/// nginx on the PATH, or Debian's (/usr/sbin is not on every user's PATH), or where `NGINX`
/// says.
fn nginx() -> String {
    if let Ok(path) = std::env::var("NGINX") {
        return path;
    }
    let debian = "/usr/sbin/nginx";
    let on_path = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join("nginx").exists()));
    if on_path || !Path::new(debian).exists() {
        "nginx".into()
    } else {
        debian.into()
    }
}

/// A port of 127.0.0.1 free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port to learn a free one");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    addr.port()
}

/// `www/robots.txt` and `www/page/0` .. `www/page/{pages-1}`, each page distinct HTML of
/// a few hundred bytes.
fn write_pages(dir: &Path, pages: usize) {
    let www = dir.join("www");
    std::fs::create_dir_all(www.join("page")).expect("make the site's directories");
    std::fs::write(www.join("robots.txt"), "User-agent: *\nAllow: /\n").expect("robots.txt");
    for i in 0..pages {
        std::fs::write(www.join("page").join(i.to_string()), page(i)).expect("write a page");
    }
}

fn page(i: usize) -> String {
    let mut body = format!(
        "<!doctype html>\n<html><head><title>Page {i}</title></head>\n<body><h1>Page {i}</h1>\n"
    );
    for line in 0..4 {
        // Writing to a String cannot fail.
        let _ = writeln!(
            body,
            "<p>Paragraph {line} of page {i}: a small static page of a rate-limited site.</p>"
        );
    }
    body.push_str("</body></html>\n");
    body
}

/// nginx.conf: one process as the current user, everything it writes under `dir`.
fn config(dir: &Path, port: u16, rate_per_s: u32, burst: u32) -> String {
    let d = dir.display();
    // As root, nginx would hand its files to `nobody`; run as root instead.
    let root = std::fs::metadata(dir).is_ok_and(|m| m.uid() == 0);
    let user = if root { "user root;\n" } else { "" };
    let burst = if burst > 0 {
        format!(" burst={burst} nodelay")
    } else {
        String::new()
    };
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\n{user}\
         pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         default_type text/html;\ntypes {{ text/plain txt; }}\n\
         log_format rate '$msec $status $request_uri';\naccess_log {d}/access.log rate;\n\
         client_body_temp_path {d}/temp_body;\nproxy_temp_path {d}/temp_proxy;\n\
         fastcgi_temp_path {d}/temp_fastcgi;\nuwsgi_temp_path {d}/temp_uwsgi;\n\
         scgi_temp_path {d}/temp_scgi;\n\
         limit_req_zone $binary_remote_addr zone=site:1m rate={rate_per_s}r/s;\n\
         limit_req_status 429;\nlimit_req_log_level warn;\n\
         server {{\n\
         listen 127.0.0.1:{port};\nroot {d}/www;\n\
         location = /robots.txt {{ }}\n\
         location / {{ limit_req zone=site{burst}; }}\n\
         }}\n}}\n"
    )
}

/// `<secs>.<millis> <status> <path>`.
fn parse_line(line: &str) -> Option<Answer> {
    let mut fields = line.splitn(3, ' ');
    let (secs, millis) = fields.next()?.split_once('.')?;
    let at = SystemTime::UNIX_EPOCH
        + Duration::from_secs(secs.parse().ok()?)
        + Duration::from_millis(millis.parse().ok()?);
    let status = fields.next()?.parse().ok()?;
    let path = fields.next()?.to_owned();
    Some(Answer { at, status, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("an HTTP client")
    }

    /// The status of a GET of `url`, its body read. No answer says when to come back.
    async fn get(client: &reqwest::Client, url: &str) -> u16 {
        let response = client.get(url).send().await.expect("reach nginx");
        let status = response.status().as_u16();
        assert!(!response.headers().contains_key("retry-after"));
        response.bytes().await.expect("read the body");
        status
    }

    fn statuses(answers: &[Answer]) -> Vec<u16> {
        answers.iter().map(|a| a.status).collect()
    }

    #[tokio::test]
    async fn a_burst_meets_429s_and_requests_at_the_rate_all_get_200() {
        let site = RateLimitedSite::start(2, 0, 3).await;
        let client = client();
        let mut burst = Vec::new();
        for i in 0..10 {
            burst.push(get(&client, &site.page_url(i % 3)).await);
        }
        assert!(burst.contains(&200), "{burst:?}");
        assert!(burst.contains(&429), "{burst:?}");
        for _ in 0..3 {
            assert_eq!(get(&client, &site.url("/robots.txt")).await, 200);
        }
        let answers = site.wait_answers(10).await;
        assert_eq!(statuses(&answers), burst);
        let paths: Vec<_> = answers.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(paths[..4], ["/page/0", "/page/1", "/page/2", "/page/0"]);
        assert_eq!(site.all_answers().len(), 13, "robots.txt is logged too");
        assert!(share_of(&answers, 429) >= 0.5, "{answers:?}");

        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut spaced = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(600));
        for i in 0..5 {
            tick.tick().await;
            spaced.push(get(&client, &site.page_url(i % 3)).await);
        }
        assert_eq!(spaced, [200; 5]);
        let answers = site.wait_answers(15).await;
        assert_eq!(statuses(&answers[10..]), spaced);
    }

    #[test]
    fn a_log_line_reads_as_an_answer() {
        let answer = parse_line("1700000000.123 429 /page/7?x=1").expect("a well-formed line");
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(answer.at, at);
        assert_eq!((answer.status, answer.path.as_str()), (429, "/page/7?x=1"));
        assert_eq!(parse_line("garbage"), None);
    }
}
