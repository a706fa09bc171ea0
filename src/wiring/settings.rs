//! The one place the wiring reads the configuration. Each stage's settings are built from
//! [`Config`] here, so no module below the wiring imports `config`.

use crate::batch::BatchLimits;
use crate::metrics::MetricsSettings;
use crate::polite::{Politeness, RobotsPaid};
use crate::pushback::backoff::Backoff;
use crate::pushback::retry::RetryPolicy;
use crate::scraper::FetchSettings;
use crate::wiring::config::Config;
use crate::worker::RecordSettings;

impl From<&Config> for BatchLimits {
    fn from(config: &Config) -> Self {
        let max_concurrency = config.record_concurrency();
        if max_concurrency < config.max_concurrency {
            tracing::warn!(
                max_concurrency,
                configured = config.max_concurrency,
                memory_mb = config.function_memory_mb,
                max_body_bytes = config.max_body_bytes,
                "MAX_CONCURRENCY lowered: the function's memory holds no more bodies at MAX_BODY_BYTES"
            );
        }
        Self {
            max_concurrency,
            deadline_margin: config.deadline_margin,
        }
    }
}

impl From<&Config> for FetchSettings {
    fn from(config: &Config) -> Self {
        Self {
            connect_timeout: config.connect_timeout,
            max_body_bytes: config.max_body_bytes,
            user_agent: config.user_agent.clone(),
            allow_private_networks: config.allow_private_networks,
            allowed_ports: config.allowed_ports.clone(),
            proxies: config.proxies.clone(),
            proxy_session: config.proxy_session,
            proxy_refuses_private: config.proxy_refuses_private,
            extra_roots: Vec::new(),
        }
    }
}

impl From<&Config> for Backoff {
    fn from(config: &Config) -> Self {
        Self {
            base: config.retry_backoff_base,
            max: config.retry_backoff_max,
            jitter: fastrand::f64,
        }
    }
}

impl From<&Config> for RecordSettings {
    fn from(config: &Config) -> Self {
        Self {
            results_prefix: config.results_prefix.clone(),
            quarantine_prefix: config.quarantine_prefix.clone(),
            max_attempts: config.max_attempts,
            max_redirects: config.max_redirects,
            scrape_timeout: config.scrape_timeout,
            store_reserve: config.store_reserve,
            conflict_retries: RetryPolicy::default(),
            parents_ttl: config.parents_ttl,
            backoff: config.into(),
            duplicate_policy: config.duplicate_policy,
            politeness: Politeness {
                robots_paid: RobotsPaid {
                    tier: config.proxies.len(),
                    ..config.politeness.robots_paid
                },
                ..config.politeness.clone()
            },
            proxy_tiers: config.proxies.len(),
            paid_fetch_cap: crate::scraper::most_spent(config.max_body_bytes),
            paid_lease: crate::paid::LEASE,
            render_queue: config.render_queue.clone(),
        }
    }
}

impl From<&Config> for MetricsSettings {
    fn from(config: &Config) -> Self {
        Self {
            namespace: config.metrics_namespace.clone(),
            service: config.metrics_service.clone(),
        }
    }
}
