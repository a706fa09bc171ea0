//! Configuration: every setting the worker reads from its environment, with its default.

use std::str::FromStr;
use std::time::Duration;

use crate::domain::hops::MOST_REDIRECTS;
use crate::domain::limits::{HostLimits, MAX_SLOTS};
use crate::domain::proxy::Tiers;
use crate::polite::robots::{ROBOTS_PAID_BUDGET, agent_token};
use crate::polite::{Politeness, RobotsPaid};
use crate::ports::queue::QueueRef;

/// Why the cold start cannot go on.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} is required but not set")]
    Missing { name: &'static str },
    #[error("{name}={value:?} is not valid: expected {expected}")]
    Invalid {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// The message leaves out the value, which may hold a credential.
    #[error("PROXY_URLS is not valid: {0}")]
    Proxies(String),
    #[error("PROXY_MARKS is not valid: {0}")]
    ProxyMarks(String),
}

pub use crate::domain::model::DuplicatePolicy;

/// Settings for one cold start. `README.md` documents each one.
#[derive(Debug, Clone)]
pub struct Config {
    pub table_name: String,
    pub results_bucket: String,
    pub results_prefix: String,
    pub quarantine_prefix: String,
    pub max_concurrency: usize,
    pub max_attempts: u32,
    pub scrape_timeout: Duration,
    /// Time kept free before the batch's cutoff for storing a fetched page. No fetch starts
    /// in it, or runs on into it.
    pub store_reserve: Duration,
    pub connect_timeout: Duration,
    pub max_redirects: usize,
    pub max_body_bytes: u64,
    pub user_agent: String,
    pub allow_private_networks: bool,
    /// Destination ports a fetch may use. `None` for any.
    pub allowed_ports: Option<Vec<u16>>,
    pub deadline_margin: Duration,
    pub retry_backoff_base: Duration,
    pub retry_backoff_max: Duration,
    pub duplicate_policy: DuplicatePolicy,
    /// The CloudWatch namespace of the worker's metrics.
    pub metrics_namespace: String,
    /// The `Service` dimension of the worker's metrics.
    pub metrics_service: String,
    /// How long a sandbox trusts a run's "job active, run running" before reading it again.
    pub parents_ttl: Duration,
    /// The function's memory in MB, as Lambda sets it (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`).
    pub function_memory_mb: Option<u64>,
    /// Per-host limits shared by the fleet, and robots.txt.
    pub politeness: Politeness,
    /// The proxy tiers every fetch goes through, and what each marks (`PROXY_MARKS`). With
    /// none, fetches go direct.
    pub proxies: Tiers,
    /// The Secrets Manager secret holding the proxies' credentials, read once per cold start.
    pub proxy_secret_arn: Option<String>,
    /// How long a host keeps the proxy it was given in a tier.
    pub proxy_session: Duration,
    /// The proxies refuse private networks themselves (`PROXY_REFUSES_PRIVATE`). So a target
    /// name that does not resolve here is left for the proxy to resolve. With the default,
    /// false, such a name is not fetched, and is retried as a DNS failure.
    pub proxy_refuses_private: bool,
    /// Traces by OTLP, one per task (`TRACING`, `TRACE_SAMPLE_RATE`,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, `TRACE_EXPORT_TIMEOUT_MS`).
    pub tracing: TraceSettings,
    /// The renderer's queue (`RENDER_QUEUE_ARN`): tasks whose pages need a browser are handed
    /// over to it. None: every page is fetched plain.
    pub render_queue: Option<QueueRef>,
}

/// How traces are sampled and exported. Off: no tracer is installed at all.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    pub on: bool,
    /// The share of tasks traced when the producer did not decide.
    pub sample_rate: f64,
    /// The OTLP/HTTP endpoint; spans go to `<endpoint>/v1/traces`.
    pub endpoint: String,
    /// The longest one export may take, after an invocation's reply was posted.
    pub export_timeout: Duration,
}

/// The ADOT collector layer listens here.
pub const OTLP_ENDPOINT: &str = "http://localhost:4318";
/// The share of tasks traced when their producer did not decide: 1%.
pub const TRACE_SAMPLE_RATE: f64 = 0.01;
/// Memory the collector layer takes in the sandbox when spans go to it. An estimate, not
/// measured here: docs/deploying.md says how to check it.
pub const COLLECTOR_BYTES: u64 = 48 * 1024 * 1024;

impl TraceSettings {
    /// Spans go to a collector in this sandbox (the layer), which takes its memory.
    pub fn to_local_collector(&self) -> bool {
        self.on && self.endpoint.trim_end_matches('/') == OTLP_ENDPOINT
    }
}

/// Memory the process needs besides the bodies in flight: runtime, TLS, SDK clients and
/// logs. Set with room to spare over the measured need (docs/performance.md).
pub const PROCESS_BYTES: u64 = 32 * 1024 * 1024;
/// Memory a record needs besides its body: connection, decoder and request buffers. Set
/// above the measured need (docs/performance.md).
pub const RECORD_OVERHEAD_BYTES: u64 = 512 * 1024;

impl Config {
    /// The records a batch runs at once: `MAX_CONCURRENCY`, lowered when the function's
    /// memory could not hold that many bodies of `MAX_BODY_BYTES` beside the process (and
    /// the collector layer, when traces go to it).
    pub fn record_concurrency(&self) -> usize {
        let Some(memory_mb) = self.function_memory_mb else {
            return self.max_concurrency;
        };
        let collector = if self.tracing.to_local_collector() {
            COLLECTOR_BYTES
        } else {
            0
        };
        let room = (memory_mb * 1024 * 1024).saturating_sub(PROCESS_BYTES + collector);
        let fits = room / (self.max_body_bytes + RECORD_OVERHEAD_BYTES);
        let fits = usize::try_from(fits).unwrap_or(usize::MAX).max(1);
        self.max_concurrency.min(fits)
    }
}

impl Config {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds the settings from any name -> value lookup (the environment, or a test's map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(&get);
        Ok(Self {
            table_name: env.required("TABLE_NAME")?,
            results_bucket: env.required("RESULTS_BUCKET")?,
            // Set but empty is a choice here: result keys without a prefix.
            results_prefix: (get)("RESULTS_PREFIX").unwrap_or_else(|| "results/".into()),
            quarantine_prefix: env.text("QUARANTINE_PREFIX", "quarantine/"),
            max_concurrency: env.positive("MAX_CONCURRENCY", 16)?,
            max_attempts: env.positive("MAX_ATTEMPTS", 5)?,
            scrape_timeout: env.millis("SCRAPE_TIMEOUT_MS", 30_000)?,
            store_reserve: env.millis("STORE_RESERVE_MS", 3_000)?,
            connect_timeout: env.millis("CONNECT_TIMEOUT_MS", 5_000)?,
            max_redirects: env.redirects()?,
            max_body_bytes: env.positive("MAX_BODY_BYTES", 10 * 1024 * 1024)?,
            user_agent: env.text(
                "USER_AGENT",
                concat!("conveyor-worker/", env!("CARGO_PKG_VERSION")),
            ),
            allow_private_networks: env.parsed("ALLOW_PRIVATE_NETWORKS", false, "true or false")?,
            allowed_ports: env.ports("ALLOWED_PORTS")?,
            deadline_margin: env.millis("DEADLINE_MARGIN_MS", 2_000)?,
            retry_backoff_base: env.millis("RETRY_BACKOFF_BASE_MS", 5_000)?,
            retry_backoff_max: env.millis("RETRY_BACKOFF_MAX_MS", 900_000)?,
            duplicate_policy: env.parsed(
                "DUPLICATE_POLICY",
                DuplicatePolicy::Converge,
                "converge or lease",
            )?,
            metrics_namespace: env.text("METRICS_NAMESPACE", "conveyor"),
            metrics_service: env.text("METRICS_SERVICE", "conveyor-worker"),
            parents_ttl: Duration::from_millis(env.parsed(
                "PARENTS_TTL_MS",
                5_000,
                "milliseconds",
            )?),
            function_memory_mb: env
                .get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
                .and_then(|m| m.parse().ok()),
            politeness: env.politeness()?,
            proxies: Tiers::parse(&env.get("PROXY_URLS").unwrap_or_default())
                .map_err(ConfigError::Proxies)?
                .marked(&env.get("PROXY_MARKS").unwrap_or_default())
                .map_err(ConfigError::ProxyMarks)?,
            proxy_secret_arn: env.get("PROXY_SECRET_ARN"),
            proxy_session: env.millis("PROXY_SESSION_MS", 600_000)?,
            proxy_refuses_private: env.parsed("PROXY_REFUSES_PRIVATE", false, "true or false")?,
            tracing: env.tracing()?,
            render_queue: env.queue("RENDER_QUEUE_ARN")?,
        })
    }
}

/// A host with no limits set gets one request a second and two at once. That is about what
/// a person clicking through the site costs it, and a slow site is not piled on.
pub const HOST_MAX_RPS: f64 = 1.0;
pub const HOST_MAX_INFLIGHT: u32 = 2;
/// A task waits at most two days for its host. So a one-host run that takes a day at the
/// host's rate (86,400 tasks at 1 a second) completes, and a host that never has room fails
/// its tasks.
pub const POLITE_MAX_WAIT_MS: u64 = 48 * 3_600_000;

/// Settings read by name through `get` (the environment, or a test's table), each checked
/// as the worker's are; the renderer reads its own settings with it too.
pub struct Env<'a, F>(pub &'a F);

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    /// A set but empty variable counts as unset, as it does for most AWS tooling.
    pub fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.is_empty())
    }

    /// A text setting, or `default` when unset or empty.
    pub fn text(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }

    pub fn required(&self, name: &'static str) -> Result<String, ConfigError> {
        self.get(name).ok_or(ConfigError::Missing { name })
    }

    pub fn parsed<T: FromStr>(
        &self,
        name: &'static str,
        default: T,
        expected: &'static str,
    ) -> Result<T, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(value) => value.trim().parse().map_err(|_| ConfigError::Invalid {
                name,
                value,
                expected,
            }),
        }
    }

    pub fn positive<T: FromStr + PartialOrd + Default>(
        &self,
        name: &'static str,
        default: T,
    ) -> Result<T, ConfigError> {
        const EXPECTED: &str = "a whole number above 0";
        let value = self.parsed(name, default, EXPECTED)?;
        if value > T::default() {
            Ok(value)
        } else {
            Err(ConfigError::Invalid {
                name,
                value: self.get(name).unwrap_or_default(),
                expected: EXPECTED,
            })
        }
    }

    /// `MAX_REDIRECTS`: at most [`MOST_REDIRECTS`], so a copy carrying its hops stays small.
    fn redirects(&self) -> Result<usize, ConfigError> {
        const EXPECTED: &str = "a whole number from 0 to 20";
        // The message names the bound: the build fails if the bound moves without it.
        const _: () = assert!(MOST_REDIRECTS == 20);
        let most = self.parsed("MAX_REDIRECTS", 10, EXPECTED)?;
        if most <= MOST_REDIRECTS {
            return Ok(most);
        }
        Err(self.invalid("MAX_REDIRECTS", EXPECTED))
    }

    fn tracing(&self) -> Result<TraceSettings, ConfigError> {
        let on = match self.text("TRACING", "off").to_ascii_lowercase().as_str() {
            "on" | "true" => true,
            "off" | "false" => false,
            _ => {
                let value = self.text("TRACING", "");
                let expected = "on or off";
                return Err(ConfigError::Invalid {
                    name: "TRACING",
                    value,
                    expected,
                });
            }
        };
        const SHARE: &str = "a share from 0 to 1";
        let sample_rate: f64 = self.parsed("TRACE_SAMPLE_RATE", TRACE_SAMPLE_RATE, SHARE)?;
        if !(0.0..=1.0).contains(&sample_rate) {
            let value = self.text("TRACE_SAMPLE_RATE", "");
            return Err(ConfigError::Invalid {
                name: "TRACE_SAMPLE_RATE",
                value,
                expected: SHARE,
            });
        }
        Ok(TraceSettings {
            on,
            sample_rate,
            endpoint: self.text("OTEL_EXPORTER_OTLP_ENDPOINT", OTLP_ENDPOINT),
            export_timeout: self.millis("TRACE_EXPORT_TIMEOUT_MS", 200)?,
        })
    }

    fn politeness(&self) -> Result<Politeness, ConfigError> {
        let rps: f64 = self.parsed(
            "HOST_MAX_RPS",
            HOST_MAX_RPS,
            "requests a second, 0 for none",
        )?;
        if !(0.0..=10_000.0).contains(&rps) {
            return Err(self.invalid("HOST_MAX_RPS", "requests a second, 0 to 10000"));
        }
        let inflight: u32 =
            self.parsed("HOST_MAX_INFLIGHT", HOST_MAX_INFLIGHT, "a whole number")?;
        if inflight > MAX_SLOTS {
            return Err(self.invalid("HOST_MAX_INFLIGHT", "a whole number, 0 to 64"));
        }
        let user_agent = self
            .get("USER_AGENT")
            .unwrap_or_else(|| "conveyor-worker".into());
        // robots.txt gets its own timeout: 10 s, or the scrape timeout if that is shorter.
        let scrape_timeout = self.millis("SCRAPE_TIMEOUT_MS", 30_000)?;
        let robots_timeout = scrape_timeout.min(Duration::from_secs(10)).as_millis() as u64;
        Ok(Politeness {
            limits: HostLimits {
                max_rps: (rps > 0.0).then_some(rps),
                max_inflight: (inflight > 0).then_some(inflight),
            },
            obey_robots: self.parsed("OBEY_ROBOTS", true, "true or false")?,
            robots_ttl: self.millis("ROBOTS_TTL_MS", 86_400_000)?,
            robots_retry: self.millis("ROBOTS_RETRY_MS", 60_000)?,
            robots_timeout: self.millis("ROBOTS_TIMEOUT_MS", robots_timeout)?,
            max_sleep: self.millis("POLITE_SLEEP_MAX_MS", 1_000)?,
            max_wait: self.millis("POLITE_MAX_WAIT_MS", POLITE_MAX_WAIT_MS)?,
            agent: agent_token(&user_agent),
            // The tier is set from `PROXY_URLS` (`wiring/settings.rs`).
            robots_paid: RobotsPaid {
                tier: 0,
                budget: self.parsed("ROBOTS_PAID_BUDGET_BYTES", ROBOTS_PAID_BUDGET, "bytes")?,
            },
        })
    }

    fn invalid(&self, name: &'static str, expected: &'static str) -> ConfigError {
        ConfigError::Invalid {
            name,
            value: self.get(name).unwrap_or_default(),
            expected,
        }
    }

    /// A queue named by its ARN, if set.
    pub fn queue(&self, name: &'static str) -> Result<Option<QueueRef>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(arn) => QueueRef::from_arn(&arn)
                .map(Some)
                .ok_or_else(|| self.invalid(name, "an SQS queue ARN")),
        }
    }

    pub fn millis(&self, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
        self.positive(name, default).map(Duration::from_millis)
    }

    /// A comma-separated list of ports. Unset means any port.
    fn ports(&self, name: &'static str) -> Result<Option<Vec<u16>>, ConfigError> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        let ports: Result<Vec<u16>, _> = value.split(',').map(|p| p.trim().parse()).collect();
        match ports {
            Ok(ports) if !ports.is_empty() && !ports.contains(&0) => Ok(Some(ports)),
            _ => Err(ConfigError::Invalid {
                name,
                value,
                expected: "a comma-separated list of ports, e.g. 80,443",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::proxy::Marks;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| vars.get(name).cloned())
    }

    const REQUIRED: [(&str, &str); 2] = [("TABLE_NAME", "tasks"), ("RESULTS_BUCKET", "results")];

    #[test]
    fn defaults_apply_when_only_the_required_settings_are_given() {
        let config = config(&REQUIRED).unwrap();
        assert_eq!(config.results_prefix, "results/");
        assert_eq!(config.max_concurrency, 16);
        assert_eq!(config.max_attempts, 5);
        assert_eq!(config.scrape_timeout, Duration::from_secs(30));
        assert_eq!(config.max_body_bytes, 10 * 1024 * 1024);
        assert!(!config.allow_private_networks);
        assert!(
            !config.proxy_refuses_private,
            "a name unchecked here is refused"
        );
        assert_eq!(config.allowed_ports, None);
        let polite = config.politeness;
        assert_eq!(polite.limits.max_rps, Some(1.0));
        assert_eq!(polite.limits.max_inflight, Some(2));
        assert!(polite.obey_robots);
        assert_eq!(polite.agent, "conveyor-worker");
    }

    #[test]
    fn tracing_is_off_unless_asked_and_its_share_must_be_one_from_zero_to_one() {
        let with = |vars: &[(&'static str, &'static str)]| {
            let mut all = REQUIRED.to_vec();
            all.extend(vars);
            config(&all).map(|c| c.tracing)
        };

        let off = with(&[]).unwrap();
        assert!(!off.on && !off.to_local_collector());
        let on = with(&[("TRACING", "on"), ("TRACE_SAMPLE_RATE", "0.25")]).unwrap();
        assert!(on.on && on.to_local_collector());
        assert_eq!(
            (on.sample_rate, on.export_timeout),
            (0.25, Duration::from_millis(200))
        );
        let elsewhere = [
            ("TRACING", "ON"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ];
        assert!(!with(&elsewhere).unwrap().to_local_collector());
        assert!(with(&[("TRACING", "yes")]).is_err());
        assert!(with(&[("TRACE_SAMPLE_RATE", "1.5")]).is_err());
        assert!(with(&[("TRACE_EXPORT_TIMEOUT_MS", "0")]).is_err());
    }

    #[test]
    fn host_limits_of_zero_mean_none_and_out_of_range_ones_are_refused() {
        let with = |rps: &str, inflight: &str| {
            let mut vars = REQUIRED.to_vec();
            vars.extend([("HOST_MAX_RPS", rps), ("HOST_MAX_INFLIGHT", inflight)]);
            config(&vars).map(|c| c.politeness.limits)
        };

        assert!(with("0", "0").unwrap().is_none());
        assert_eq!(with("2.5", "4").unwrap().max_rps, Some(2.5));
        assert!(with("-1", "4").is_err());
        assert!(with("1", "65").is_err());
    }

    #[test]
    fn concurrency_is_lowered_to_what_the_function_memory_holds() {
        let with = |memory: &str, concurrency: &str| {
            let mut vars = REQUIRED.to_vec();
            vars.extend([
                ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", memory),
                ("MAX_CONCURRENCY", concurrency),
            ]);
            config(&vars).unwrap().record_concurrency()
        };
        assert_eq!(with("256", "16"), 16, "the template's defaults fit");
        assert_eq!(with("256", "64"), 21);
        assert_eq!(with("128", "16"), 9);
        assert_eq!(with("64", "16"), 3);
        assert_eq!(with("32", "16"), 1, "always at least one");
        assert_eq!(config(&REQUIRED).unwrap().record_concurrency(), 16);
    }

    #[test]
    fn an_empty_results_prefix_means_no_prefix_and_an_unset_one_the_default() {
        let mut vars = REQUIRED.to_vec();
        assert_eq!(config(&vars).unwrap().results_prefix, "results/");
        vars.push(("RESULTS_PREFIX", ""));
        assert_eq!(config(&vars).unwrap().results_prefix, "");
    }

    #[test]
    fn proxy_tiers_are_read_and_a_credential_in_them_is_never_echoed() {
        let mut vars = REQUIRED.to_vec();
        vars.push((
            "PROXY_URLS",
            "http://dc1:3128,http://dc2:3128;http://resi:8000",
        ));
        let read = config(&vars).unwrap();
        assert_eq!(read.proxies.len(), 2);
        assert_eq!(read.proxy_session, Duration::from_secs(600));

        let mut vars = REQUIRED.to_vec();
        vars.push(("PROXY_URLS", "http://me:hunter2@dc1:3128"));
        let err = config(&vars).unwrap_err().to_string();
        assert!(
            err.starts_with("PROXY_URLS") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn an_old_config_without_proxy_marks_reads_every_tier_as_marking_what_it_forwards() {
        let mut vars = REQUIRED.to_vec();
        vars.push(("PROXY_URLS", "http://dc1:3128;http://resi:8000"));
        let old = config(&vars).unwrap();
        vars.push(("PROXY_MARKS", "forwarded;errors"));
        let marked = config(&vars).unwrap();
        vars.push(("PROXY_MARKS", "errors;errors;errors"));
        let too_many = config(&vars).unwrap_err().to_string();

        assert_eq!(
            (old.proxies.marks(1), old.proxies.marks(2)),
            (Marks::Forwarded, Marks::Forwarded)
        );
        assert_eq!(marked.proxies.marks(2), Marks::Errors);
        assert!(
            too_many.starts_with("PROXY_MARKS is not valid: 3 words for 2 tiers"),
            "{too_many}"
        );
    }

    #[test]
    fn allowed_ports_are_a_list() {
        let mut vars = REQUIRED.to_vec();
        vars.push(("ALLOWED_PORTS", "80, 443,8080"));
        assert_eq!(
            config(&vars).unwrap().allowed_ports,
            Some(vec![80, 443, 8080])
        );
        for bad in ["80;443", "http", "0", "70000", ","] {
            let mut vars = REQUIRED.to_vec();
            vars.push(("ALLOWED_PORTS", bad));
            assert!(config(&vars).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_required_setting_is_named() {
        let err = config(&[("TABLE_NAME", "tasks")]).unwrap_err();
        assert_eq!(err.to_string(), "RESULTS_BUCKET is required but not set");
        let err = config(&[("TABLE_NAME", ""), ("RESULTS_BUCKET", "b")]).unwrap_err();
        assert_eq!(err, ConfigError::Missing { name: "TABLE_NAME" });
    }

    #[test]
    fn an_invalid_setting_is_named_with_its_value() {
        for (name, value) in [
            ("MAX_CONCURRENCY", "0"),
            ("MAX_CONCURRENCY", "many"),
            ("SCRAPE_TIMEOUT_MS", "-1"),
            ("ALLOW_PRIVATE_NETWORKS", "yes"),
        ] {
            let mut vars = REQUIRED.to_vec();
            vars.push((name, value));
            let err = config(&vars).unwrap_err().to_string();
            assert!(err.starts_with(&format!("{name}={value:?}")), "{err}");
        }
    }

    /// The settings table of docs/configuration.md: each row's names (the first cell's
    /// backticked words in capitals) and its default cell.
    fn documented() -> Vec<(Vec<String>, String)> {
        let doc = include_str!("../../docs/configuration.md");
        doc.lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let names: Vec<String> = cells
                    .get(1)?
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                    .map(str::to_owned)
                    .collect();
                (!names.is_empty()).then(|| (names, cells.get(2).copied().unwrap_or("").to_owned()))
            })
            .collect()
    }

    /// What the runtime sets or reads itself, beside the worker's own settings: Lambda's
    /// variables and the ones logging reads before the configuration (`wiring/traces.rs`).
    const READ_ELSEWHERE: [&str; 5] = [
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_LAMBDA_LOG_FORMAT",
        "AWS_LAMBDA_LOG_LEVEL",
        "RUST_LOG",
    ];

    /// The documented defaults that are one plain value and are not the default: each is
    /// given as its setting, and the configuration compared with the defaults' (`defaults`).
    fn wrong_defaults(rows: &[(Vec<String>, String)], defaults: &str) -> Vec<String> {
        let one_value = |default: &str| {
            let value = default.strip_prefix('`')?.strip_suffix('`')?;
            (!value.contains(['`', '<'])).then(|| value.to_owned())
        };
        rows.iter()
            .filter(|(names, _)| names.len() == 1)
            .filter_map(|(names, default)| Some((names[0].as_str(), one_value(default)?)))
            .filter(|(name, value)| {
                let given = [
                    ("TABLE_NAME", "set"),
                    ("RESULTS_BUCKET", "set"),
                    (name, value),
                ];
                config(&given).map(|c| format!("{c:?}")).as_deref() != Ok(defaults)
            })
            .map(|(name, value)| format!("{name} = {value}"))
            .collect()
    }

    #[test]
    fn every_setting_read_is_documented_with_its_default_and_every_documented_one_is_read() {
        // Arrange: every name the configuration asks for, with the required ones given.
        let asked = std::sync::Mutex::new(std::collections::BTreeSet::new());
        let required = |name: &str| {
            asked.lock().unwrap().insert(name.to_owned());
            matches!(name, "TABLE_NAME" | "RESULTS_BUCKET").then(|| "set".to_owned())
        };
        let defaults = format!("{:?}", Config::from_lookup(required).expect("the defaults"));
        let asked = asked.into_inner().unwrap();
        let rows = documented();
        let names: std::collections::BTreeSet<&str> = rows
            .iter()
            .flat_map(|(n, _)| n.iter().map(String::as_str))
            .collect();

        // Act
        let wrong = wrong_defaults(&rows, &defaults);

        // Assert
        let undocumented: Vec<_> = asked
            .iter()
            .filter(|n| !names.contains(n.as_str()))
            .collect();
        let unread: Vec<_> = names
            .iter()
            .filter(|n| !asked.contains(**n) && !READ_ELSEWHERE.contains(n))
            .collect();
        assert!(
            undocumented.is_empty(),
            "read, not in configuration.md: {undocumented:?}"
        );
        assert!(
            unread.is_empty(),
            "in configuration.md, never read: {unread:?}"
        );
        assert!(wrong.is_empty(), "not the default: {wrong:?}");
        assert!(asked.len() >= 30, "{} settings asked for", asked.len());
    }
}
