//! What conveyor-worker's tests, benches and tooling share: a fresh table and bucket in the
//! local AWS emulator (moto, plain or behind the production-like layer), clients that log
//! every request they send, seeding helpers, SQS event builders, the local site, in-process
//! stores, fault injection, the chaos scenario, and items as earlier releases wrote them.

pub mod app_site;
pub mod block_pages;
pub mod canary;
pub mod chaos;
pub mod demo;
pub mod fixtures;
pub mod forward_proxy;
pub mod fresh_site;
pub mod host_watch;
pub mod logs;
pub mod lose;
pub mod matrix;
pub mod memory;
pub mod nginx;
pub mod ops_binary;
pub mod otlp;
pub mod pause;
pub mod polite_site;
pub mod queue;
pub mod renderer;
pub mod runtime_api;
pub mod scenario;
pub mod site;
pub mod tls_site;
pub mod troubled_site;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use conveyor_worker::Worker;
use conveyor_worker::batch::{BatchLimits, ProcessRecord, process_batch};
use conveyor_worker::domain::ids::{Id, RunRef, TaskRef};
use conveyor_worker::domain::model::{ShardSizes, Sharding};
use conveyor_worker::domain::proxy::{ProxySecret, Tiers};
use conveyor_worker::polite::{Politeness, RobotsPaid};
use conveyor_worker::pushback::backoff::Backoff;
use conveyor_worker::pushback::retry::RetryPolicy;
use conveyor_worker::scraper::{AddressPolicy, FetchSettings, HttpFetcher, Lookup, SystemLookup};
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::attributes::{self, Item};
use conveyor_worker::store::dynamo::keys;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::SqsVisibility;
use conveyor_worker::wiring::aws::s3_config;
use conveyor_worker::wiring::config::DuplicatePolicy;
use conveyor_worker::worker::RecordSettings;
pub use ops_binary::ops_binary;
use serde_json::json;

pub use site::Site;

pub type TestWorker = Worker<DynamoTaskStore, S3ResultStore, HttpFetcher, SqsVisibility>;

pub const JOB: &str = "job-1";
pub const RUN: &str = "run-1";
pub const PREFIX: &str = "results/";

/// An earlier result a refresh task names: where it lies, its bytes, its entity tag.
#[derive(Debug, Clone, Copy)]
pub struct Earlier<'a> {
    pub key: &'a str,
    pub body: &'a [u8],
    pub etag: &'a str,
}

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
/// Tests cap bodies below [`site::BIG_BODY`].
pub const MAX_BODY_BYTES: u64 = 16 * 1024;
pub const MAX_ATTEMPTS: u32 = 5;

/// Every request (attempt) a client sent, by operation name, and the visibility timeouts
/// the worker set (`ChangeMessageVisibility`): what it decided, whatever the machine's speed.
#[derive(Debug, Clone, Default)]
pub struct CallLog {
    /// Each request's operation, in order.
    operations: Arc<Mutex<Vec<String>>>,
    /// Each `ChangeMessageVisibility`'s timeout, in seconds, in order.
    holds: Arc<Mutex<Vec<u64>>>,
}

impl CallLog {
    pub fn calls(&self) -> Vec<String> {
        self.operations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The holds set with `ChangeMessageVisibility`, in seconds, in order.
    pub fn holds(&self) -> Vec<u64> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn count(&self, operation: &str) -> usize {
        self.calls().iter().filter(|c| *c == operation).count()
    }

    pub fn clear(&self) {
        self.operations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Intercept for CallLog {
    fn name(&self) -> &'static str {
        "CallLog"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let name = cfg.load::<Metadata>().map_or("?", |m| m.name()).to_owned();
        if name == "ChangeMessageVisibility" {
            let body = context.request().body().bytes().unwrap_or_default();
            let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            if let Some(hold) = request["VisibilityTimeout"].as_u64() {
                self.holds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(hold);
            }
        }
        self.operations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name);
        Ok(())
    }
}

/// The emulator's endpoint, set by `scripts/with-moto` (through `make test`).
pub fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL")
        .expect("AWS_ENDPOINT_URL is not set: run the tests with `make test`")
}

/// The emulator behind the production-like layer (`scripts/prodlike.py`), set by
/// `scripts/with-moto`.
pub fn prodlike_endpoint() -> String {
    std::env::var("PRODLIKE_ENDPOINT_URL")
        .expect("PRODLIKE_ENDPOINT_URL is not set: run the tests with `make test`")
}

/// SDK config for the emulator, with fake credentials: nothing leaves 127.0.0.1. The HTTP
/// client is the worker's own.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    sdk_config_as(endpoint, "test").await
}

/// The access key the worker's requests are signed with. The emulator checks each of them
/// against what the function's role in template.yaml grants (`scripts/iam_role.py`).
pub const WORKER_KEY: &str = "conveyor-worker";
/// The access key id `conveyor-ops` signs with in the tests: the emulator checks its calls
/// against the operator's policy (scripts/iam_role.py).
pub const OPS_KEY: &str = "conveyor-ops";

/// Clients' configuration for `endpoint`, signing with the access key `key`.
pub async fn sdk_config_as(endpoint: &str, key: &str) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(conveyor_worker::wiring::aws::https_client())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, "test", None, None, "tests"))
        .load()
        .await
}

/// A name no other test of this run uses.
/// Now, in milliseconds since the epoch (as SQS's `SentTimestamp` and the worker's copies say).
pub fn now_ms() -> u64 {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    now.expect("after 1970").as_millis() as u64
}

pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh table and bucket, an uncounted admin client pair, and the worker's counted clients.
pub struct Stack {
    pub table: String,
    pub bucket: String,
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub calls: CallLog,
    sdk: SdkConfig,
    worker_endpoint: String,
}

impl Stack {
    pub async fn new() -> Self {
        Self::at(&endpoint()).await
    }

    /// A stack whose worker talks to `endpoint`, while seeding goes to the emulator.
    pub async fn at(worker_endpoint: &str) -> Self {
        Self::named(worker_endpoint, &unique("tasks"), &unique("results")).await
    }

    /// A stack with this table and bucket (for names a person types).
    pub async fn named(worker_endpoint: &str, table: &str, bucket: &str) -> Self {
        let admin = sdk_config(&endpoint()).await;
        let stack = Self {
            table: table.to_owned(),
            bucket: bucket.to_owned(),
            dynamodb: aws_sdk_dynamodb::Client::new(&admin),
            s3: aws_sdk_s3::Client::from_conf(s3_config(&admin).build()),
            sqs: aws_sdk_sqs::Client::new(&admin),
            calls: CallLog::default(),
            sdk: sdk_config_as(worker_endpoint, WORKER_KEY).await,
            worker_endpoint: worker_endpoint.to_owned(),
        };
        stack.create_table().await;
        stack
            .s3
            .create_bucket()
            .bucket(&stack.bucket)
            .send()
            .await
            .expect("create bucket");
        stack
    }

    /// Deletes every item of the table and every object of the bucket.
    pub async fn clear(&self) {
        let mut items = self
            .dynamodb
            .scan()
            .table_name(&self.table)
            .into_paginator()
            .items()
            .send();
        while let Some(item) = items.next().await {
            let item = item.expect("scan the table");
            let key = ["pk", "sk"].map(|name| (name.to_owned(), item[name].clone()));
            self.dynamodb
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(key.into_iter().collect()))
                .send()
                .await
                .expect("delete an item");
        }
        let bucket = S3ResultStore::new(self.s3.clone(), &self.bucket);
        for key in bucket.keys_under("").await.expect("list the bucket") {
            bucket.delete(&key).await.expect("delete an object");
        }
    }

    /// A stack whose worker meets AWS as production has it (`scripts/prodlike.py`):
    /// transaction conflicts, stale eventually consistent reads, S3's header limits and 409s.
    /// Seeding and checks still go to the emulator directly.
    pub async fn prodlike() -> Self {
        Self::at(&prodlike_endpoint()).await
    }

    /// The worker's requests on this stack's table or bucket that its role does not grant,
    /// as "<table or bucket> <action>" (`scripts/iam_role.py` refused them as AWS would).
    pub async fn denied(&self) -> Vec<String> {
        let stats = layer_stats().await;
        let ours = |key: &&String| {
            [&self.table, &self.bucket]
                .iter()
                .any(|name| key.starts_with(&format!("{name} ")))
        };
        match stats.get("denied").and_then(|d| d.as_object()) {
            Some(denied) => denied.keys().filter(ours).cloned().collect(),
            None => Vec::new(),
        }
    }

    /// For `seconds` from now, the production-like layer refuses a `share` of the writes to
    /// this stack's table as throttled (`ProvisionedThroughputExceededException`).
    pub async fn throttle_writes(&self, share: f64, seconds: f64) {
        let ask = json!({"table": self.table, "share": share, "seconds": seconds});
        let response = layer_client()
            .post(format!("{}/_prodlike/throttle", prodlike_endpoint()))
            .body(ask.to_string())
            .send()
            .await
            .expect("reach the production-like layer");
        assert!(response.status().is_success(), "{}", response.status());
    }

    /// The next `times` writes of the run item meet a transaction in flight.
    pub async fn conflict_on_run(&self, job: &str, run: &str, times: u32) {
        let key = key_json(&keys::run_key(&id(job), &id(run)));
        layer_post(json!({"table": self.table, "key": key, "times": times})).await;
    }

    /// The next `times` writes of the task item meet a transaction in flight.
    pub async fn conflict_on_task(&self, task: &str, times: u32) {
        let key = key_json(&keys::task_key(&task_ref(task)));
        layer_post(json!({"table": self.table, "key": key, "times": times})).await;
    }

    /// The next `times` conditional PUTs of the object meet another in flight (S3's 409).
    pub async fn conflict_on_object(&self, key: &str, times: u32) {
        layer_post(json!({"bucket": self.bucket, "key": key, "times": times})).await;
    }

    /// How often the layer did `kind` (e.g. `transaction_conflicts`) to this stack's table
    /// or bucket.
    pub async fn layer_count(&self, kind: &str) -> u64 {
        let stats = layer_stats().await;
        let of = |name: &str| stats[kind][name].as_u64();
        of(&self.table).or_else(|| of(&self.bucket)).unwrap_or(0)
    }

    async fn create_table(&self) {
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("name and type are set")
        };
        let key = |name: &str, kind| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .expect("name and type are set")
        };
        self.dynamodb
            .create_table()
            .table_name(&self.table)
            .attribute_definitions(attribute("pk"))
            .attribute_definitions(attribute("sk"))
            .key_schema(key("pk", KeyType::Hash))
            .key_schema(key("sk", KeyType::Range))
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await
            .expect("create table");
    }

    /// The worker under test, with its requests logged in [`Stack::calls`].
    pub fn worker(&self) -> TestWorker {
        self.worker_with(|_| {})
    }

    pub fn worker_with(&self, tune: impl FnOnce(&mut WorkerTuning)) -> TestWorker {
        self.worker_fetching(tune, |tuning, fetch| {
            let (settings, policy, lookup) = fetch;
            HttpFetcher::with_policy(&settings, policy, lookup)
                .and_then(|direct| direct.with_proxies(&settings, &tuning.proxy_secret))
                .expect("build the HTTP clients")
        })
    }

    /// The worker under test with the fetcher `fetcher` makes from the tuning's fetch
    /// settings, address policy and resolver (the renderer's tests give a browser).
    pub fn worker_fetching<F>(
        &self,
        tune: impl FnOnce(&mut WorkerTuning),
        fetcher: impl FnOnce(&WorkerTuning, (FetchSettings, AddressPolicy, Arc<dyn Lookup>)) -> F,
    ) -> Worker<DynamoTaskStore, S3ResultStore, F, SqsVisibility> {
        let mut tuning = WorkerTuning::default();
        tune(&mut tuning);
        let sdk = match (tuning.faults, self.sdk.http_client()) {
            (Some(faults), Some(inner)) => self
                .sdk
                .to_builder()
                .http_client(chaos::ChaosHttp { inner, faults })
                .build(),
            _ => self.sdk.clone(),
        };
        let mut dynamodb_config =
            aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(self.calls.clone());
        if let Some(interceptor) = tuning.dynamodb_interceptor.clone() {
            dynamodb_config.push_interceptor(interceptor);
        }
        let dynamodb_config = dynamodb_config.build();
        let s3_sdk = match (tuning.s3_faults, sdk.http_client()) {
            (Some(faults), Some(inner)) => sdk
                .to_builder()
                .http_client(chaos::ChaosHttp { inner, faults })
                .build(),
            _ => sdk.clone(),
        };
        let s3_config = s3_config(&s3_sdk).interceptor(self.calls.clone()).build();
        let sqs_config = aws_sdk_sqs::config::Builder::from(&sdk)
            .interceptor(self.calls.clone())
            .build();
        let bucket = tuning.bucket.clone().unwrap_or_else(|| self.bucket.clone());
        let settings = FetchSettings {
            max_body_bytes: tuning.max_body_bytes,
            allow_private_networks: tuning.allow_private_networks,
            proxies: tuning.proxies.clone(),
            proxy_refuses_private: tuning.proxy_refuses_private,
            extra_roots: tuning.extra_roots.clone(),
            ..direct_fetch_settings()
        };
        let policy = AddressPolicy::new(tuning.allow_private_networks, None)
            .trusting(tuning.trusted.iter().copied());
        let lookup = tuning
            .lookup
            .clone()
            .unwrap_or_else(|| Arc::new(SystemLookup));
        Worker::new(
            DynamoTaskStore::new(
                aws_sdk_dynamodb::Client::from_conf(dynamodb_config),
                &self.table,
            ),
            S3ResultStore::new(aws_sdk_s3::Client::from_conf(s3_config), bucket),
            fetcher(&tuning, (settings, policy, lookup)),
            SqsVisibility::new(
                aws_sdk_sqs::Client::from_conf(sqs_config),
                Some(self.worker_endpoint.clone()),
            ),
            tuning.settings(),
        )
    }

    pub async fn put_job(&self, job: &str, status: &str) {
        let mut item = keys::job_key(&id(job));
        item.insert("status".into(), attributes::s(status));
        self.put(item).await;
    }

    /// An active job with its own rate for its hosts (`host_max_rps`, data contract v2).
    pub async fn put_polite_job(&self, job: &str, max_rps: f64) {
        let mut item = keys::job_key(&id(job));
        item.insert("status".into(), attributes::s("active"));
        item.insert("host_max_rps".into(), attributes::n(max_rps));
        self.put(item).await;
    }

    /// An active job with its own rate for its hosts and, if given, in-flight limit (data
    /// contract v2).
    pub async fn put_limited_job(&self, job: &str, max_rps: f64, max_inflight: Option<u32>) {
        let mut item = keys::job_key(&id(job));
        item.insert("status".into(), attributes::s("active"));
        item.insert("host_max_rps".into(), attributes::n(max_rps));
        if let Some(inflight) = max_inflight {
            item.insert("host_max_inflight".into(), attributes::n(inflight));
        }
        self.put(item).await;
    }

    pub async fn put_run(&self, job: &str, run: &str, status: &str) {
        let mut item = keys::run_key(&id(job), &id(run));
        item.insert("status".into(), attributes::s(status));
        self.put(item).await;
    }

    /// A running run with its counters at the start: `total` tasks, all remaining.
    pub async fn put_counted_run(&self, job: &str, run: &str, total: u32) {
        let mut item = keys::run_key(&id(job), &id(run));
        item.insert("status".into(), attributes::s("running"));
        for (counter, value) in [
            ("tasks_total", total),
            ("tasks_remaining", total),
            ("tasks_succeeded", 0),
            ("tasks_failed", 0),
        ] {
            item.insert(counter.into(), attributes::n(value));
        }
        self.put(item).await;
    }

    /// A running run counted in `shards` counter shards and `groups` groups (data contract
    /// v2) for these tasks, each counter sized by the tasks that fall in it, as a producer
    /// writes them.
    pub async fn put_sharded_run(
        &self,
        (job, run): (&str, &str),
        tasks: &[String],
        (shards, groups): (u32, u32),
    ) {
        self.put_counter_tree((job, run), tasks, (shards, groups), false)
            .await;
    }

    /// [`Stack::put_sharded_run`] with the run's tasks and results spread over its shards
    /// (data contract v3): put its tasks with [`Stack::put_task_of`].
    pub async fn put_spread_run(
        &self,
        (job, run): (&str, &str),
        tasks: &[String],
        (shards, groups): (u32, u32),
    ) {
        self.put_counter_tree((job, run), tasks, (shards, groups), true)
            .await;
    }

    async fn put_counter_tree(
        &self,
        (job, run): (&str, &str),
        tasks: &[String],
        (shards, groups): (u32, u32),
        spread: bool,
    ) {
        let ids: Vec<Id> = tasks.iter().map(|t| id(t)).collect();
        let sizes = ShardSizes::of(Sharding { shards, groups }, &ids);
        let store = DynamoTaskStore::new(self.dynamodb.clone(), &self.table);
        let (job, run) = (id(job), id(run));
        store
            .create_run(
                RunRef::new(&job, &run),
                ids.len() as u64,
                (Some(&sizes), spread, None),
            )
            .await
            .expect("create the run");
        store
            .create_counters(&job, &run, &sizes)
            .await
            .expect("create the counters");
    }

    /// The run's counters as (succeeded, failed, remaining): its own, or its shards' added
    /// up when it counts in shards.
    pub async fn run_counters(&self, job: &str, run: &str) -> (u64, u64, u64) {
        let item = self.run_item(job, run).await;
        let counters = ["tasks_succeeded", "tasks_failed", "tasks_remaining"];
        let shards = item.n("counter_shards").unwrap_or(0) as u32;
        let sum = |items: &[Item], name: &str| -> u64 {
            items
                .iter()
                .filter_map(|i| attributes::number::<u64>(i, name))
                .sum()
        };
        let items = if shards == 0 {
            vec![item.0]
        } else {
            DynamoTaskStore::new(self.dynamodb.clone(), &self.table)
                .shard_items(&id(job), &id(run), shards)
                .await
                .expect("read the shards")
        };
        let [succeeded, failed, remaining] = counters.map(|name| sum(&items, name));
        (succeeded, failed, remaining)
    }

    /// What is wrong with a sharded run's counter tree (nothing for a run without one):
    /// each group must count as left exactly its shards with tasks left, the run exactly its
    /// groups (or shards) with something left, and no counter may be below zero.
    pub async fn counter_tree_faults(&self, job: &str, run: &str) -> Vec<String> {
        let item = self.run_item(job, run).await;
        let (shards, groups) = (item.n("counter_shards"), item.n("counter_groups"));
        let Some(shards) = shards.filter(|n| *n > 0) else {
            return Vec::new();
        };
        let store = DynamoTaskStore::new(self.dynamodb.clone(), &self.table);
        let (job, run) = (id(job), id(run));
        let read = |items: Result<Vec<Item>, _>, left: &str| -> Vec<(u64, i64)> {
            let items = items.expect("read the counters");
            let index = |i: &Item| {
                attributes::string(i, "pk")?
                    .rsplit('#')
                    .next()?
                    .parse()
                    .ok()
            };
            let counted = |i: &Item| Some((index(i)?, attributes::number::<i64>(i, left)?));
            items.iter().filter_map(counted).collect()
        };
        let shards = read(
            store.shard_items(&job, &run, shards as u32).await,
            "tasks_remaining",
        );
        let groups = groups.unwrap_or(0);
        let groups = read(
            store.group_items(&job, &run, groups as u32).await,
            "shards_remaining",
        );
        let open = |children: &[(u64, i64)], parent: Option<(u64, u64)>| -> i64 {
            let mine = |i: &u64| parent.is_none_or(|(g, n)| i % n == g);
            children
                .iter()
                .filter(|(i, left)| mine(i) && *left > 0)
                .count() as i64
        };
        let mut faults: Vec<String> = shards
            .iter()
            .chain(&groups)
            .filter(|(_, left)| *left < 0)
            .map(|(i, left)| format!("counter {i} has {left} left"))
            .collect();
        let count = groups.len() as u64;
        for (g, left) in &groups {
            if *left != open(&shards, Some((*g, count))) {
                faults.push(format!("group {g} counts {left} shards left"));
            }
        }
        let (name, children) = match groups.is_empty() {
            true => ("shards_remaining", &shards),
            false => ("groups_remaining", &groups),
        };
        let left = item.n(name).map(|n| n as i64);
        if left != Some(open(children, None)) {
            faults.push(format!("the run counts {name} {left:?}"));
        }
        faults
    }

    /// Every task of a run: (task id, item), through the run's partition.
    pub async fn tasks_in_run(&self, job: &str, run: &str) -> Vec<(String, TaskItem)> {
        // The operator's own listing: one partition, or each of a v3 run's shards'.
        DynamoTaskStore::new(self.dynamodb.clone(), &self.table)
            .run_tasks(&id(job), &id(run))
            .await
            .expect("query a run's tasks")
            .into_iter()
            .map(|(task, item)| (task, TaskItem(item)))
            .collect()
    }

    /// The run item as stored.
    pub async fn run_item(&self, job: &str, run: &str) -> TaskItem {
        self.item(keys::run_key(&id(job), &id(run))).await
    }

    /// An item read consistently, or an empty map when it is gone.
    pub async fn item(&self, key: Item) -> TaskItem {
        let item = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .expect("read an item")
            .item
            .unwrap_or_default();
        TaskItem(item)
    }

    /// `host` (`name:port`) cools down for `seconds` more before its next request, as
    /// another sandbox's 429 would have left it.
    pub async fn cool_host(&self, host: &str, seconds: u64) {
        let until = SystemTime::now() + Duration::from_secs(seconds);
        let until = until
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970");
        let mut item = conveyor_worker::store::dynamo::keys::host_key(host, "HOST");
        let until = conveyor_worker::store::dynamo::attributes::n(until.as_millis());
        item.insert("cooldown_until".into(), until);
        let put = self
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        put.send().await.expect("put the host item");
    }

    /// An active job with a running run of 1000 tasks: [`JOB`] / [`RUN`].
    pub async fn put_active_run(&self) {
        self.put_job(JOB, "active").await;
        self.put_counted_run(JOB, RUN, 1000).await;
    }

    /// Gives [`RUN`] a budget of `bytes` for the paid proxy tier.
    pub async fn set_paid_budget(&self, bytes: u64) {
        self.dynamodb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::run_key(&id(JOB), &id(RUN))))
            .update_expression("SET paid_tier_budget_bytes = :budget")
            .expression_attribute_values(":budget", attributes::n(bytes))
            .send()
            .await
            .expect("set the run's budget");
    }

    pub async fn put_task(&self, task: &str, url: &str, status: &str) {
        self.put_task_in(JOB, RUN, task, url, status).await;
    }

    pub async fn put_task_in(&self, job: &str, run: &str, task: &str, url: &str, status: &str) {
        self.put_task_of(&task_ref_in(job, run, task), url, status)
            .await;
    }

    /// A task item where `task` says it lives (its run's partition, or its shard's in v3).
    pub async fn put_task_of(&self, task: &TaskRef, url: &str, status: &str) {
        let mut item = keys::task_key(task);
        item.extend(attributes::strings(&[("url", url), ("status", status)]));
        self.put(item).await;
    }

    /// A pending refresh task at `url`: its earlier result under `key`, of `body` (whose
    /// SHA-256 the task names), which had the entity tag `etag`.
    pub async fn put_refresh_task_of(&self, task: &TaskRef, url: &str, earlier: Earlier<'_>) {
        let mut item = keys::task_key(task);
        let Earlier { key, body, etag } = earlier;
        item.extend(attributes::strings(&[
            ("url", url),
            ("status", "pending"),
            ("prior_result_key", key),
            ("prior_sha256", &sha256_hex(body)),
            ("prior_etag", etag),
        ]));
        self.put(item).await;
    }

    /// An earlier run's result under `key`: `body` with S3's SHA-256 checksum of it and, if
    /// `described`, the metadata the worker writes.
    pub async fn put_earlier(&self, key: &str, body: &[u8], described: bool) {
        let mut put = self
            .s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(body.to_vec().into())
            .content_type("text/html")
            .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Sha256);
        if described {
            put = put
                .metadata("sha256", sha256_hex(body))
                .metadata("http-status", "200")
                .metadata("final-url", "http://earlier.example/");
        }
        put.send().await.expect("put an object");
    }

    /// Sets job `job`'s `render` (`always`, `auto` or `never`), as a producer would.
    pub async fn set_job_render(&self, job: &str, choice: &str) {
        self.dynamodb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::job_key(&id(job))))
            .update_expression("SET #r = :r")
            .expression_attribute_names("#r", "render")
            .expression_attribute_values(":r", attributes::s(choice))
            .send()
            .await
            .expect("set the job's render");
    }

    /// Puts a lease on a task of [`JOB`] / [`RUN`], as a delivery's claim would.
    pub async fn set_lease(&self, task: &str, owner: &str, until: SystemTime) {
        let millis = until
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        self.dynamodb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(keys::task_key(&task_ref(task))))
            .update_expression("SET lease_owner = :o, lease_until = :u")
            .expression_attribute_values(":o", attributes::s(owner))
            .expression_attribute_values(":u", attributes::n(millis))
            .send()
            .await
            .expect("set a lease");
    }

    /// Writes an item as a producer would.
    pub async fn put_item(&self, item: Item) {
        self.put(item).await;
    }

    async fn put(&self, item: Item) {
        self.dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .expect("seed an item");
    }

    /// The task item in [`JOB`] / [`RUN`] as stored, or an empty map when it is gone.
    pub async fn task(&self, task: &str) -> TaskItem {
        self.task_in(JOB, RUN, task).await
    }

    /// A host's item of the worker's (`sk` `HOST` or `ROBOTS`) as stored, or an empty map.
    /// `host`: `name:port`.
    pub async fn host_item(&self, host: &str, sk: &str) -> TaskItem {
        self.item(keys::host_key(host, sk)).await
    }

    pub async fn task_in(&self, job: &str, run: &str, task: &str) -> TaskItem {
        self.item(keys::task_key(&task_ref_in(job, run, task)))
            .await
    }

    /// Body, metadata and content type of the object under `key`, if any.
    pub async fn object(&self, key: &str) -> Option<StoredObject> {
        let out = match self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => out,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => return None,
            Err(err) => panic!("read {key}: {err:?}"),
        };
        Some(StoredObject {
            content_type: out.content_type.clone().unwrap_or_default(),
            metadata: out.metadata.clone().unwrap_or_default(),
            body: out.body.collect().await.expect("read the body").to_vec(),
        })
    }

    /// Puts an object as an earlier delivery would have stored it.
    pub async fn put_object(&self, key: &str, body: &[u8], http_status: u16) {
        self.put_typed_object(key, body, (http_status, "text/plain"))
            .await;
    }

    /// Puts an object as an earlier delivery would have stored it, of this status and type.
    pub async fn put_typed_object(&self, key: &str, body: &[u8], typed: (u16, &str)) {
        self.put_marked_object(key, body, typed, &[]).await;
    }

    /// Puts an object as [`Stack::put_typed_object`] does, with more metadata: `marks`.
    pub async fn put_marked_object(
        &self,
        key: &str,
        body: &[u8],
        (status, content_type): (u16, &str),
        marks: &[(&str, &str)],
    ) {
        use sha2::Digest;
        let http_status = status;
        let request = self
            .s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(body.to_vec().into())
            .content_type(content_type)
            .metadata("sha256", hex::encode(sha2::Sha256::digest(body)))
            .metadata("http-status", http_status.to_string())
            .metadata("final-url", "http://earlier.example/")
            .metadata("source-url", "http://earlier.example/")
            .metadata("fetched-at", "2026-01-01T00:00:00Z");
        let request = marks.iter().fold(request, |request, (name, value)| {
            request.metadata(*name, *value)
        });
        request.send().await.expect("put an object");
    }

    pub fn key(task: &str) -> String {
        format!("{PREFIX}{JOB}/{RUN}/{task}")
    }
}

/// What a test may change about the worker.
pub struct WorkerTuning {
    pub scrape_timeout: Duration,
    /// Kept free before the cutoff for storing a page.
    pub store_reserve: Duration,
    /// How writes that meet concurrent ones are tried again.
    pub conflict_retries: RetryPolicy,
    /// How long the worker keeps a run's "wanted" answer.
    pub parents_ttl: Duration,
    pub bucket: Option<String>,
    /// On by default: the local site is on 127.0.0.1.
    pub allow_private_networks: bool,
    /// `PROXY_REFUSES_PRIVATE` (default false, as deployed).
    pub proxy_refuses_private: bool,
    /// Roots the fetcher trusts besides Mozilla's: an https front's CA ([`tls_site`]).
    pub extra_roots: Vec<Vec<u8>>,
    /// `MAX_BODY_BYTES`: [`MAX_BODY_BYTES`] unless a test needs a page of real size.
    pub max_body_bytes: u64,
    /// Addresses the fetcher trusts although they are not public (a site on 127.0.0.2).
    pub trusted: Vec<std::net::IpAddr>,
    /// The resolver; the system's unless a test gives a table.
    pub lookup: Option<Arc<dyn Lookup>>,
    pub backoff: Backoff,
    pub duplicate_policy: DuplicatePolicy,
    /// AWS faults injected into the worker's DynamoDB, S3 and SQS clients.
    pub faults: Option<chaos::Faults>,
    /// Faults injected into its S3 client alone (after `faults`): a slow store, say, while
    /// the queue answers at once.
    pub s3_faults: Option<chaos::Faults>,
    /// Off unless a test turns it on: these tests check one record's contract, a race or a
    /// fault against one local site, where a host's rate would turn their records into
    /// polite waits; politeness at its production defaults is tested by
    /// tests/it/polite_defaults.rs, the chaos scenario and `make run`.
    pub politeness: Politeness,
    /// Proxy tiers (none: direct) and their credentials.
    pub proxies: Tiers,
    pub proxy_secret: ProxySecret,
    /// How long a sandbox's paid-tier lease lasts (production's 30 minutes by default; a
    /// test of a sandbox that dies holding one shrinks it rather than wait).
    pub paid_lease: Duration,
    /// The renderer's queue the worker hands pages that need a browser over to (none: all
    /// fetched plain).
    pub render_queue: Option<conveyor_worker::ports::queue::QueueRef>,
    /// An interceptor on the worker's DynamoDB client besides the request counter (one that
    /// loses an answer, say).
    pub dynamodb_interceptor: Option<aws_sdk_dynamodb::config::SharedInterceptor>,
}

impl WorkerTuning {
    /// The record settings these tunings make, the rest as the emulator tests use them.
    pub fn settings(&self) -> RecordSettings {
        RecordSettings {
            results_prefix: PREFIX.into(),
            quarantine_prefix: "quarantine/".into(),
            max_attempts: MAX_ATTEMPTS,
            max_redirects: 3,
            scrape_timeout: self.scrape_timeout,
            store_reserve: self.store_reserve,
            conflict_retries: self.conflict_retries,
            parents_ttl: self.parents_ttl,
            backoff: self.backoff,
            duplicate_policy: self.duplicate_policy,
            // The last proxy tier is the paid one for robots.txt, as the wiring sets it.
            politeness: Politeness {
                robots_paid: RobotsPaid {
                    tier: self.proxies.len(),
                    ..self.politeness.robots_paid
                },
                ..self.politeness.clone()
            },
            proxy_tiers: self.proxies.len(),
            paid_fetch_cap: conveyor_worker::scraper::most_spent(self.max_body_bytes),
            paid_lease: self.paid_lease,
            render_queue: self.render_queue.clone(),
        }
    }
}

impl Default for WorkerTuning {
    fn default() -> Self {
        Self {
            scrape_timeout: Duration::from_secs(10),
            store_reserve: Duration::from_millis(500),
            conflict_retries: RetryPolicy::default(),
            parents_ttl: Duration::from_secs(5),
            bucket: None,
            allow_private_networks: true,
            proxy_refuses_private: false,
            extra_roots: Vec::new(),
            max_body_bytes: MAX_BODY_BYTES,
            trusted: Vec::new(),
            lookup: None,
            // Deterministic: always the ceiling, one second doubling.
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(60),
                jitter: || 1.0,
            },
            duplicate_policy: DuplicatePolicy::Converge,
            faults: None,
            s3_faults: None,
            politeness: Politeness::off(),
            proxies: Tiers::default(),
            paid_lease: conveyor_worker::paid::LEASE,
            render_queue: None,
            dynamodb_interceptor: None,
            proxy_secret: ProxySecret::default(),
        }
    }
}

fn layer_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client")
}

async fn layer_post(hold: serde_json::Value) {
    let response = layer_client()
        .post(format!("{}/_prodlike/conflict", prodlike_endpoint()))
        .body(hold.to_string())
        .send()
        .await
        .expect("reach the production-like layer");
    assert!(response.status().is_success(), "{}", response.status());
}

/// What the production-like layer did: `{kind: {table or bucket: count}}`.
pub async fn layer_stats() -> serde_json::Value {
    let body = layer_client()
        .get(format!("{}/_prodlike/stats", prodlike_endpoint()))
        .send()
        .await
        .expect("reach the production-like layer")
        .bytes()
        .await
        .expect("read the stats");
    serde_json::from_slice(&body).expect("stats are JSON")
}

/// A key as the production-like layer's admin paths take it (DynamoDB JSON).
fn key_json(key: &Item) -> serde_json::Value {
    let attribute = |name: &str| json!({ "S": attributes::string(key, name) });
    json!({ "pk": attribute("pk"), "sk": attribute("sk") })
}

/// A task (or run) item as read back.
#[derive(Debug)]
pub struct TaskItem(pub Item);

impl TaskItem {
    pub fn s(&self, name: &str) -> Option<&str> {
        attributes::string(&self.0, name)
    }

    pub fn n(&self, name: &str) -> Option<u64> {
        attributes::number(&self.0, name)
    }

    pub fn status(&self) -> Option<&str> {
        self.s("status")
    }
}

pub struct StoredObject {
    pub body: Vec<u8>,
    pub metadata: HashMap<String, String>,
    pub content_type: String,
}

impl StoredObject {
    pub fn sha256(&self) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&self.body))
    }
}

/// An SQS record as Lambda delivers it.
pub fn record(message_id: &str, body: &str, receive_count: u32) -> SqsMessage {
    serde_json::from_value(json!({
        "messageId": message_id,
        "receiptHandle": format!("handle-{message_id}"),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": receive_count.to_string(),
            "SentTimestamp": "1764482400000",
        },
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:conveyor-tasks",
        "awsRegion": "us-east-1",
    }))
    .expect("a well-formed SQS record")
}

/// The body naming `task` in [`JOB`] / [`RUN`].
pub fn body(task: &str) -> String {
    json!({"job_id": JOB, "run_id": RUN, "task_id": task}).to_string()
}

/// `task` of [`JOB`] / [`RUN`].
pub fn task_ref(task: &str) -> TaskRef {
    task_ref_in(JOB, RUN, task)
}

/// `task` of `job` / `run`.
pub fn task_ref_in(job: &str, run: &str, task: &str) -> TaskRef {
    TaskRef::new(id(job), id(run), id(task))
}

/// An id a test names (valid by construction).
pub fn id(raw: &str) -> Id {
    Id::parse(raw).unwrap_or_else(|e| panic!("{raw:?} {e}"))
}

/// A direct fetch's settings for tests and tools: a 2 s connect bound, pages of at most
/// [`MAX_BODY_BYTES`], no proxies, only public addresses (a test trusts its site's address
/// in its policy).
pub fn direct_fetch_settings() -> FetchSettings {
    FetchSettings {
        connect_timeout: Duration::from_secs(2),
        max_body_bytes: MAX_BODY_BYTES,
        user_agent: "conveyor-worker-tests".into(),
        allow_private_networks: false,
        allowed_ports: None,
        proxies: Tiers::default(),
        proxy_session: Duration::from_secs(600),
        proxy_refuses_private: false,
        extra_roots: Vec::new(),
    }
}

/// A first delivery of `task`, with the task id as message id.
pub fn delivery(task: &str) -> SqsMessage {
    record(task, &body(task), 1)
}

/// First deliveries of `t0` to `t{n-1}`.
pub fn deliveries(n: usize) -> Vec<SqsMessage> {
    (0..n).map(|i| delivery(&format!("t{i}"))).collect()
}

pub fn event(records: Vec<SqsMessage>) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = records;
    event
}

pub const LIMITS: BatchLimits = BatchLimits {
    max_concurrency: 16,
    deadline_margin: Duration::from_millis(500),
};

/// Sends the worker's logs to the test's output (shown for failing tests); RUST_LOG filters.
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "conveyor_worker=debug".into());
    let _already_set = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

/// Runs a batch with a minute to go, as Lambda would.
pub async fn run_batch<P: ProcessRecord>(
    processor: &P,
    records: Vec<SqsMessage>,
) -> SqsBatchResponse {
    init_logs();
    let deadline = SystemTime::now() + Duration::from_secs(60);
    let request_id = unique("request");
    process_batch(
        processor,
        &event(records).records,
        &request_id,
        deadline,
        LIMITS,
    )
    .await
}

/// The message ids the reply asks SQS to redeliver.
pub fn retried(reply: &SqsBatchResponse) -> Vec<String> {
    reply
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}
