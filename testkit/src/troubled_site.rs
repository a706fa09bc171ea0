//! Local sites that behave as real ones do under load (one page at a time behind a short
//! queue, a storm of errors, a silence, or healthy), each with a log of its page requests,
//! for tests of the worker's adaptive politeness.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

/// How a site behaves, chosen when it starts. Every page that is served answers 200 with a
/// small body; `/robots.txt` answers 404 at once and is not logged.
#[derive(Debug, Clone, Copy)]
pub enum Trouble {
    /// One page at a time, each taking `page_time`: capacity is one page per `page_time`
    /// and latency grows with the queue. A request that comes while `queue` requests
    /// already wait (besides the one served) gets a bare 503 at once, without Retry-After.
    Serial { page_time: Duration, queue: usize },
    /// Page requests that arrive within `lasting` of the storm's start get `status` at
    /// once; the others get a page after `page_time`.
    Storm {
        status: u16,
        lasting: Duration,
        page_time: Duration,
    },
    /// Page requests that arrive within `lasting` of the silence's start are never
    /// answered (the server waits until their client gives up); the others get a page
    /// after `page_time`.
    Silent {
        lasting: Duration,
        page_time: Duration,
    },
    /// Every page after `page_time`.
    Healthy { page_time: Duration },
}

impl Trouble {
    /// How long a storm or silence lasts; `None` for the modes without one.
    fn lasting(&self) -> Option<Duration> {
        match *self {
            Trouble::Storm { lasting, .. } | Trouble::Silent { lasting, .. } => Some(lasting),
            Trouble::Serial { .. } | Trouble::Healthy { .. } => None,
        }
    }
}

/// One page request: its path, when it arrived (on both clocks), when it ended and the
/// status answered. `status` is `None` if the client gave up before an answer (or the
/// request is still in flight: then `ended` is `None` too).
#[derive(Debug, Clone)]
pub struct PageVisit {
    pub path: String,
    pub arrived: Instant,
    pub arrived_at: SystemTime,
    pub ended: Option<Instant>,
    pub status: Option<u16>,
}

impl PageVisit {
    /// Whether its client gave up before an answer.
    pub fn dropped(&self) -> bool {
        self.ended.is_some() && self.status.is_none()
    }
}

/// When the storm or silence starts.
#[derive(Debug, Clone, Copy, Default)]
enum Window {
    /// Not yet (or never, for the modes without one).
    #[default]
    Closed,
    /// With the next page request.
    AtFirstPage,
    /// From the first instant, until (not including) the second.
    Open(Instant, Instant),
}

#[derive(Debug, Default)]
struct Log {
    visits: Vec<PageVisit>,
    in_flight: usize,
    most_in_flight: usize,
    /// Serial: requests being served or waiting for their turn.
    admitted: usize,
    window: Window,
}

/// What a site shares with its handlers.
struct Shared {
    mode: Trouble,
    log: Mutex<Log>,
    /// Serial: the one turn to be served.
    turn: Semaphore,
}

/// A running troubled site on 127.0.0.1; it stops with the test's runtime.
#[derive(Clone)]
pub struct TroubledSite {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl TroubledSite {
    pub async fn start(mode: Trouble) -> Self {
        if let Trouble::Storm { status, .. } = mode {
            StatusCode::from_u16(status).expect("a storm's status is an HTTP status");
        }
        let shared = Arc::new(Shared {
            mode,
            log: Mutex::new(Log::default()),
            turn: Semaphore::new(1),
        });
        let app = Router::new().fallback(serve).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("a bound address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, shared }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `http://127.0.0.1:<port>/page/<i>`.
    pub fn page_url(&self, i: usize) -> String {
        self.url(&format!("/page/{i}"))
    }

    /// Starts the storm now (a `Storm` site only).
    pub fn storm_now(&self) {
        assert!(
            matches!(self.shared.mode, Trouble::Storm { .. }),
            "not a storm"
        );
        self.open_window_now();
    }

    /// Starts the silence now (a `Silent` site only).
    pub fn silence_now(&self) {
        assert!(
            matches!(self.shared.mode, Trouble::Silent { .. }),
            "not silent"
        );
        self.open_window_now();
    }

    /// Starts the storm or silence with the next page request instead.
    pub fn trouble_at_first_page(&self) {
        assert!(self.shared.mode.lasting().is_some(), "no storm or silence");
        lock(&self.shared.log).window = Window::AtFirstPage;
    }

    /// When the storm was: from its start until (not including) its end.
    pub fn storm_window(&self) -> Option<(Instant, Instant)> {
        self.window()
    }

    /// When the silence was: from its start until (not including) its end.
    pub fn silence_window(&self) -> Option<(Instant, Instant)> {
        self.window()
    }

    /// Every page request so far, in order of arrival.
    pub fn visits(&self) -> Vec<PageVisit> {
        lock(&self.shared.log).visits.clone()
    }

    pub fn count(&self, which: impl Fn(&PageVisit) -> bool) -> usize {
        self.visits().iter().filter(|v| which(v)).count()
    }

    /// Page requests that arrived from `from` until (not including) `to`.
    pub fn arrivals_within(&self, from: Instant, to: Instant) -> usize {
        self.count(|v| from <= v.arrived && v.arrived < to)
    }

    /// The share of answered page requests answered `status` (0 if none was answered).
    pub fn status_share(&self, status: u16) -> f64 {
        let answered = self.count(|v| v.status.is_some());
        let these = self.count(|v| v.status == Some(status));
        if answered == 0 {
            return 0.0;
        }
        these as f64 / answered as f64
    }

    /// The most page requests in flight at once.
    pub fn most_in_flight(&self) -> usize {
        lock(&self.shared.log).most_in_flight
    }

    fn open_window_now(&self) {
        let lasting = self.shared.mode.lasting().expect("a mode with a window");
        let now = Instant::now();
        lock(&self.shared.log).window = Window::Open(now, now + lasting);
    }

    fn window(&self) -> Option<(Instant, Instant)> {
        match lock(&self.shared.log).window {
            Window::Open(from, to) => Some((from, to)),
            Window::Closed | Window::AtFirstPage => None,
        }
    }
}

fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the site does with one page request, decided when it arrives.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// A page after this long.
    Page(Duration),
    /// A page after this long, once it is this request's turn.
    InTurn(Duration),
    /// This status at once.
    Refuse(StatusCode),
    /// Nothing, ever.
    Silence,
}

async fn serve(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if path == "/robots.txt" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let (serving, plan) = arrive(&shared, path);
    let response = answer(&shared, plan).await;
    serving.answered(response)
}

/// Logs a page request as it arrives and decides what to do with it.
fn arrive(shared: &Arc<Shared>, path: String) -> (Serving, Plan) {
    let arrived = Instant::now();
    let mut log = lock(&shared.log);
    log.visits.push(PageVisit {
        path,
        arrived,
        arrived_at: SystemTime::now(),
        ended: None,
        status: None,
    });
    log.in_flight += 1;
    log.most_in_flight = log.most_in_flight.max(log.in_flight);
    if let (Window::AtFirstPage, Some(lasting)) = (log.window, shared.mode.lasting()) {
        log.window = Window::Open(arrived, arrived + lasting);
    }
    let troubled = matches!(log.window, Window::Open(from, to) if from <= arrived && arrived < to);
    let plan = match shared.mode {
        Trouble::Serial { queue, .. } if log.admitted > queue => {
            Plan::Refuse(StatusCode::SERVICE_UNAVAILABLE)
        }
        Trouble::Serial { page_time, .. } => Plan::InTurn(page_time),
        Trouble::Storm { status, .. } if troubled => {
            Plan::Refuse(StatusCode::from_u16(status).expect("checked at start"))
        }
        Trouble::Silent { .. } if troubled => Plan::Silence,
        Trouble::Storm { page_time, .. }
        | Trouble::Silent { page_time, .. }
        | Trouble::Healthy { page_time } => Plan::Page(page_time),
    };
    let admitted = matches!(plan, Plan::InTurn(_));
    log.admitted += usize::from(admitted);
    let serving = Serving {
        shared: shared.clone(),
        index: log.visits.len() - 1,
        admitted,
        status: None,
    };
    (serving, plan)
}

async fn answer(shared: &Shared, plan: Plan) -> Response {
    match plan {
        Plan::Page(page_time) => tokio::time::sleep(page_time).await,
        Plan::InTurn(page_time) => {
            let _turn = shared
                .turn
                .acquire()
                .await
                .expect("the turn is never closed");
            tokio::time::sleep(page_time).await;
        }
        Plan::Refuse(status) => return (status, "troubled").into_response(),
        Plan::Silence => std::future::pending().await,
    }
    "a page".into_response()
}

/// A page request in flight. Dropping it ends the request in the log: with the status
/// answered, or with none if the server dropped the request because its client closed
/// the connection.
struct Serving {
    shared: Arc<Shared>,
    index: usize,
    /// Serial: whether it holds a place among those served or waiting.
    admitted: bool,
    status: Option<u16>,
}

impl Serving {
    fn answered(mut self, response: Response) -> Response {
        self.status = Some(response.status().as_u16());
        response
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut log = lock(&self.shared.log);
        log.in_flight -= 1;
        log.admitted -= usize::from(self.admitted);
        let visit = &mut log.visits[self.index];
        visit.ended = Some(Instant::now());
        visit.status = self.status;
    }
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

    /// The status of a GET of `url` and how long it took, or the client's error.
    async fn get(client: &reqwest::Client, url: &str) -> reqwest::Result<(u16, Duration)> {
        let sent = Instant::now();
        let response = client.get(url).send().await?;
        let status = response.status().as_u16();
        response.bytes().await?;
        Ok((status, sent.elapsed()))
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// Waits (up to a second) until the site has logged the end of every page request.
    async fn until_all_ended(site: &TroubledSite) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while site.count(|v| v.ended.is_none()) > 0 && Instant::now() < deadline {
            tokio::time::sleep(ms(10)).await;
        }
    }

    #[tokio::test]
    async fn a_serial_site_serves_one_page_at_a_time_and_turns_away_a_full_queue() {
        let page_time = ms(200);
        let site = TroubledSite::start(Trouble::Serial {
            page_time,
            queue: 2,
        })
        .await;
        let client = client();

        let urls: Vec<_> = (0..6).map(|i| site.page_url(i)).collect();
        let answers = futures_util::future::join_all(urls.iter().map(|u| get(&client, u))).await;

        let answers: Vec<_> = answers.into_iter().map(|a| a.expect("an answer")).collect();
        let mut pages: Vec<_> = answers.iter().filter(|a| a.0 == 200).map(|a| a.1).collect();
        let busy: Vec<_> = answers.iter().filter(|a| a.0 == 503).map(|a| a.1).collect();
        println!("pages after {pages:?}, 503s after {busy:?}");
        assert_eq!((pages.len(), busy.len()), (3, 3), "{answers:?}");
        assert!(busy.iter().all(|took| *took < ms(150)), "{busy:?}");
        pages.sort();
        for (turn, took) in (1..).zip(&pages) {
            let served = page_time * turn;
            assert!(*took >= served && *took < served + ms(150), "{pages:?}");
        }
        until_all_ended(&site).await;
        assert_eq!(site.visits().len(), 6);
        assert_eq!(site.status_share(503), 0.5);
        assert!(site.most_in_flight() >= 3, "{}", site.most_in_flight());
    }

    #[tokio::test]
    async fn a_storm_answers_its_status_inside_the_window_and_pages_after_it() {
        let mode = Trouble::Storm {
            status: 500,
            lasting: Duration::from_secs(1),
            page_time: ms(50),
        };
        let site = TroubledSite::start(mode).await;
        let client = client();
        let before = get(&client, &site.page_url(0)).await.expect("an answer");

        site.storm_now();
        let during = get(&client, &site.page_url(1)).await.expect("an answer");
        let (from, to) = site.storm_window().expect("the storm started");
        tokio::time::sleep_until(to.into()).await;
        let after = get(&client, &site.page_url(2)).await.expect("an answer");

        assert_eq!((before.0, during.0, after.0), (200, 500, 200));
        assert!(during.1 < ms(100), "{during:?}");
        assert_eq!(to - from, Duration::from_secs(1));
        assert_eq!(site.arrivals_within(from, to), 1);
        let statuses: Vec<_> = site.visits().iter().map(|v| v.status).collect();
        assert_eq!(statuses, [Some(200), Some(500), Some(200)]);
    }

    #[tokio::test]
    async fn a_storm_armed_for_the_first_page_starts_with_it() {
        let mode = Trouble::Storm {
            status: 429,
            lasting: ms(300),
            page_time: ms(10),
        };
        let site = TroubledSite::start(mode).await;
        site.trouble_at_first_page();
        assert!(site.storm_window().is_none());

        let first = get(&client(), &site.page_url(0)).await.expect("an answer");

        assert_eq!(first.0, 429);
        let (from, _) = site.storm_window().expect("the storm started");
        assert_eq!(from, site.visits()[0].arrived);
    }

    #[tokio::test]
    async fn a_silent_site_never_answers_inside_the_window_and_pages_after_it() {
        let lasting = Duration::from_secs(1);
        let site = TroubledSite::start(Trouble::Silent {
            lasting,
            page_time: ms(50),
        })
        .await;
        let client = client();

        site.silence_now();
        let short = client.get(site.page_url(0)).timeout(ms(300)).send();
        let long = client.get(site.page_url(1)).timeout(lasting + ms(300));
        let long = tokio::spawn(long.send());
        let short = short.await.expect_err("no answer in the silence");
        tokio::time::sleep(ms(100)).await;
        let visits = site.visits();
        let dropped = visits.iter().find(|v| v.path == "/page/0").expect("logged");
        let (_, to) = site.silence_window().expect("the silence started");
        tokio::time::sleep_until(to.into()).await;
        let after = get(&client, &site.page_url(2)).await.expect("an answer");
        let long = long.await.expect("the request task ran");

        assert!(short.is_timeout(), "{short:?}");
        assert!(dropped.dropped(), "{dropped:?}");
        assert_eq!(after.0, 200, "{visits:?}");
        let long = long.expect_err("no answer, even after the silence");
        assert!(long.is_timeout(), "{long:?}");
        until_all_ended(&site).await;
        let mut statuses: Vec<_> = site
            .visits()
            .into_iter()
            .map(|v| (v.path, v.status))
            .collect();
        statuses.sort();
        let expected = [("/page/0", None), ("/page/1", None), ("/page/2", Some(200))];
        assert_eq!(
            statuses,
            expected.map(|(path, status)| (path.to_owned(), status))
        );
        assert_eq!(site.count(PageVisit::dropped), 2);
    }

    #[tokio::test]
    async fn a_healthy_site_answers_each_page_in_its_page_time() {
        let page_time = ms(100);
        let site = TroubledSite::start(Trouble::Healthy { page_time }).await;
        let client = client();

        let robots = get(&client, &site.url("/robots.txt"))
            .await
            .expect("robots");
        let page = get(&client, &site.page_url(7)).await.expect("a page");

        assert_eq!(robots.0, 404);
        assert_eq!(page.0, 200);
        assert!(
            page.1 >= page_time && page.1 < page_time + ms(150),
            "{page:?}"
        );
        let visits = site.visits();
        assert_eq!(visits.len(), 1, "robots.txt is not a page: {visits:?}");
        assert_eq!(visits[0].path, "/page/7");
        assert_eq!(visits[0].status, Some(200));
        assert_eq!(site.status_share(200), 1.0);
    }
}
