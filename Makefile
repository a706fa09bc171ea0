# conveyor-worker. `make run` shows the worker on the local stack; `make test` runs every check.
# Both set up what they need (a Python venv with the emulator and tools) on a fresh machine.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PYTHON ?= python3
PIP := $(VENV)/bin/pip install --quiet --disable-pip-version-check
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Tests and local runs never look for real credentials or instance metadata; the SAM CLI
# sends no telemetry.
export AWS_EC2_METADATA_DISABLED := true
export SAM_CLI_TELEMETRY := 0

.PHONY: test run stack build bench bench-quick bench-render chaos lint lint-rust lint-template function-deps clean tinyproxy nginx chromium

## test: fmt, clippy, the template's linters and rules, and all tests in four groups side by
## side, each against a fresh emulator of its own, the template's linters beside them (the
## emulator's venv and the renderer's Chromium install from the network while the Rust
## checks and build use the CPU).
## The binaries are built before the tests: they run conveyor-ops, a binary of another crate.
## The renderer's binary is not: no test runs it (its library is the tests' dependency).
test: tinyproxy nginx
	$(MAKE) --no-print-directory $(VENV)/.test & venv=$$!; \
	scripts/need-chromium & chromium=$$!; built=0; \
	{ cargo fmt --all -- --check && $(MAKE) --no-print-directory function-deps \
	  && cargo test --locked --workspace --no-run \
	  && cargo build --locked --workspace --exclude conveyor-renderer --bins --tests \
	    --profile test; } \
	  || built=$$?; wait $$venv && wait $$chromium && exit $$built
	$(MAKE) --no-print-directory lint-template & template=$$!; \
	scripts/with-moto cargo test --locked --workspace --test it -- --test-threads 1 $(LONG_A) \
	  & long_a=$$!; \
	scripts/with-moto cargo test --locked --workspace --test it -- --test-threads 1 $(LONG_B) \
	  & long_b=$$!; \
	nice -n 5 scripts/with-moto cargo test --locked --workspace --test it -- $(HEAVY_TESTS) \
	  & heavy=$$!; \
	rest=0; nice -n 10 scripts/with-moto cargo test --locked --workspace -- \
	  $(LONG_TESTS:%=--skip %) $(HEAVY_TESTS:%=--skip %) || rest=$$?; \
	failed=$$rest; wait $$heavy || failed=1; wait $$long_a || failed=1; \
	wait $$long_b || failed=1; \
	wait $$template || failed=1; exit $$failed
	$(MAKE) bench-quick

# In `make test`, clippy lints the workspace's crates while the test build compiles them (as
# `cargo clippy` itself runs it: rustc's workspace wrapper), so no crate is compiled twice.
# Its warnings fail the build, as `make lint` does. The bench is linted when bench-quick
# builds it.
test bench-quick: export RUSTC_WORKSPACE_WRAPPER := $(shell rustup which clippy-driver 2>/dev/null || command -v clippy-driver)
test bench-quick: export CLIPPY_ARGS := -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

## bench-quick: every benchmark at small sizes, with its assertions (part of `make test`):
## criterion's benches once each, then every figure of `make bench` (nothing written)
## (--tests: with the test targets in the build, the dependencies' features are the ones
## `cargo test` built, so after it only the benchmark's binary is linked, not 70 s of crates)
bench-quick: $(VENV)/.test tinyproxy nginx
	cargo test --locked --workspace --bench pipeline
	cargo build --locked --workspace --exclude conveyor-renderer --bins --tests --profile test
	scripts/with-moto target/debug/bench --quick

# The tests that keep the emulator busiest (whole runs of hundreds of tasks), against an
# emulator of their own beside the rest: moto serves one request at a time on one core, so
# two of them use both of the machine's. The cancelled run's 200 pages join them: the group
# ends about a minute before the others without it. (Names no unit test's path contains:
# --skip matches any part of one.)
HEAVY_TESTS := chaos:: refresh_runs::a_refresh_of_500 matrix:: \
  polite_defaults::a_cancelled_run_gives_its_hosts_bookings_back

# The longest tests (a site's pace for a minute or more, mostly waiting on it) run in two
# lines beside the two other groups, one test at a time each, against an emulator of its
# own: one fleet's emulator serves no other fleet, as a fleet's DynamoDB and SQS are not
# slowed by another test's. Their bounds count what the fleet decided (starts booked, the
# slowdown it set), not how fast this machine is. The other two groups run at a lower CPU
# priority (nice): they keep the CPU busy, and these fleets get it the moment they need it,
# as a fleet on Lambda has its own.
LONG_A := adaptive::a_real_nginx adaptive::a_storm_of_500s adaptive::a_healthy_fast_site \
  politeness::the_fleet_keeps_each_hosts_rate_and_in_flight_limits_and_two_hosts_apart
LONG_B := polite_defaults::a_run_of_300_pages_of_one_host_drains_at_its_rate \
  adaptive::a_site_serving_one_request_at_a_time adaptive::a_site_that_stops_answering
LONG_TESTS := $(LONG_A) $(LONG_B)

## chaos: the matrix (tests/it/matrix.rs) on SEEDS random seeds (default 20), each a drawn
## configuration of the whole system; a failing seed prints how to replay it
SEEDS ?= 20
chaos: $(VENV)/.test tinyproxy nginx
	MATRIX_RANDOM=$(SEEDS) scripts/with-moto cargo test --locked --test it matrix:: -- --nocapture

## run: the sample events through both functions under cargo lambda watch (the renderer's
## with Debian's headless Chromium), then a whole run
run: $(VENV)/.run chromium
	scripts/with-moto cargo run --locked --quiet -p xtask --bin demo

## stack: the local stack kept up for `cargo lambda watch` / `invoke` by hand (Ctrl-C stops)
stack: $(VENV)/.run
	MOTO_PORT=$${MOTO_PORT:-4566} scripts/with-moto cargo run --locked --quiet -p xtask --bin stack

## build: the arm64 function with `sam build` (cargo lambda and zig from PyPI), checked
build: $(VENV)/.build
	rustup target add aarch64-unknown-linux-gnu
	sam build
	python scripts/check_package.py .aws-sam/build/WorkerFunction/bootstrap

## bench: the figures against their floors, and the run progress simulation, into BENCHMARKS.md
## and docs/*.svg (`target/release/simulate` alone redoes the simulation's part, in half a minute)
bench: build $(VENV)/.test tinyproxy
	cargo build --locked --release --workspace --bins
	cargo bench --locked --bench pipeline
	scripts/with-moto target/release/bench
	target/release/simulate
	$(MAKE) --no-print-directory bench-render

## bench-render: the renderer beside Crawlee's PuppeteerCrawler (benches/crawlee/, npm ci),
## 200 client-rendered pages each, into BENCHMARKS.md's renderer section
bench-render: chromium
	cargo build --locked --release -p xtask --features render-bench --bin render-bench
	target/release/render-bench

## lint: the quick checks alone
lint: lint-rust lint-template

lint-rust: function-deps
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings

## function-deps: the function's crate links no CLI crate (they are conveyor-ops', in crates/ops)
function-deps:
	@cli=$$(cargo tree --locked -p conveyor-worker -e normal,build --prefix none \
	  | { grep -E '^(clap|indicatif|console|conveyor-ops) ' || true; } | sort -u); \
	if [ -n "$$cli" ]; then echo "the function's crate links CLI crates: $$cli"; exit 1; fi

lint-template: $(VENV)/.test
	cfn-lint template.yaml
	sam validate --lint --template template.yaml
	python tests/template_rules.py template.yaml docs/runbook.md src/wiring/config.rs \
	  docs/deploying.md crates/renderer/src/settings.rs
	python scripts/check_package.py --self-test

## tinyproxy: the forward proxy the proxy tests run against (Debian's tinyproxy-bin)
tinyproxy:
	scripts/need-tinyproxy

## chromium: the browser the renderer's tests drive (Debian's chromium-headless-shell)
chromium:
	scripts/need-chromium

## nginx: the rate-limited site testkit/src/nginx.rs starts (Debian's nginx, no service)
nginx:
	scripts/need-nginx

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	touch $@

$(VENV)/.test: requirements-test.txt $(VENV)/.created
	$(PIP) -r $<
	touch $@

$(VENV)/.run: requirements-run.txt $(VENV)/.test
	$(PIP) -r $<
	touch $@

$(VENV)/.build: requirements-build.txt $(VENV)/.test
	$(PIP) -r $<
	touch $@

clean:
	rm -rf $(VENV) target .aws-sam
