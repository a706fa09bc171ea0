# conveyor-worker. `make run` shows the worker on the local stack; `make test` runs every check.
# Both set up what they need (a Python venv with the emulator and tools) on a fresh machine.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PYTHON ?= python3
PIP := $(VENV)/bin/pip install --quiet --disable-pip-version-check
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Tests and local runs never look for real credentials or instance metadata.
export AWS_EC2_METADATA_DISABLED := true

.PHONY: test run build bench lint clean

## test: fmt, clippy, template lint, and all tests against a fresh local emulator
test: $(VENV)/.test
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	cfn-lint template.yaml
	python tests/template_rules.py template.yaml docs/runbook.md src/config.rs
	scripts/with-moto cargo test --locked

## run: the sample events through the function under cargo lambda watch, on the local stack
run: $(VENV)/.run
	scripts/with-moto cargo run --locked --quiet -p xtask --bin demo

## build: the arm64 Lambda package (cargo lambda with zig, both from PyPI), for sam deploy
build: $(VENV)/.build
	rustup target add aarch64-unknown-linux-gnu
	cargo lambda build --locked --release --arm64 --bin conveyor-worker --output-format zip
	@ls -l target/lambda/conveyor-worker/bootstrap.zip

## bench: the figures against their floors, into BENCHMARKS.md and docs/concurrency.svg
bench: build $(VENV)/.test
	cargo build --locked --release --workspace --bins
	cargo bench --locked --bench pipeline
	scripts/with-moto target/release/bench

## lint: the quick checks alone
lint: $(VENV)/.test
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	cfn-lint template.yaml
	python tests/template_rules.py template.yaml docs/runbook.md src/config.rs

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	touch $@

$(VENV)/.test: requirements-test.txt $(VENV)/.created
	$(PIP) -r $<
	touch $@

$(VENV)/.run: requirements-run.txt $(VENV)/.test
	$(PIP) -r $<
	touch $@

$(VENV)/.build: requirements-build.txt $(VENV)/.created
	$(PIP) -r $<
	touch $@

clean:
	rm -rf $(VENV) target
