# Two commands do everything on a fresh machine:
#   make demo   environment + demo bundle + the daemon on a generated sample video
#   make test   everything the suite needs (system packages included), then lint, types and tests
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXPORT_STAMP := $(VENV)/.installed-export
# torch for `models export` and its tests. Pinned so pip takes the CPU wheel these machines keep on
# disk; with no torch installed, a bare `torch` would pull a multi-GB CUDA build. Elsewhere:
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
# Debian packages the tests talk to for real (broker, browser, RTSP server).
SYSTEM_PACKAGES := mosquitto mosquitto-clients chromium shellcheck openssl
# llama.cpp builds with -march=native (-mcpu=native on ARM). On x86 VMs that advertise AMX but fault on
# its instructions (seen on this project's 2-core machines: a segfault at ldtilecfg in
# ggml_backend_amx_mul_mat) the AMX kernels must stay out: undefining the macro that guards them keeps
# every other native feature. AMX is x86-only, so other machines (a Jetson, any aarch64 box) get no flag.
HOST_ARCH ?= $(shell uname -m)
ifneq ($(filter x86_64 amd64,$(HOST_ARCH)),)
LLAMA_CMAKE_ARGS ?= -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__
else
LLAMA_CMAKE_ARGS ?=
endif

.PHONY: venv export-deps demo test lint typecheck system-deps clean bench test-image test-ota test-robustness test-nemo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# llama-cpp-python builds from source (~10 min on 2 cores, cached by pip afterwards).
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $$CMAKE_ARGS" $(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(STAMP)

# The export extra (torch, transformers, onnxscript, sentencepiece): tests only, never the daemon.
$(EXPORT_STAMP): $(STAMP)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test,export]'
	touch $@

export-deps: $(EXPORT_STAMP)

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@# node + npm for the independent protocol peers (node-opcua, modbus-serial; tests/support/npm.py), only
	@# when there is none: a NodeSource nodejs already ships npm and conflicts with Debian's npm package.
	@command -v npm >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }

demo: venv
	$(BIN)/edge-runtime run --demo

lint: venv
	$(BIN)/ruff check
	$(BIN)/lint-imports  # the layering of docs/architecture.md (contracts in pyproject.toml)
	$(BIN)/python tools/import_graph.py  # no import loops, lazy imports included

typecheck: venv
	$(BIN)/mypy

test: venv export-deps system-deps lint typecheck
	$(BIN)/python -m pytest

# Slow, not part of `make test`: the daemon on aarch64 code (docs/deploy.md, "Proven on aarch64 here"). An
# arm64 Debian tree run under qemu-user, every dependency as an aarch64 wheel from the index, llama-cpp-python
# cross-compiled for the Jetson Orin's CPU; then doctor, models demo, infer, run --demo and the tiny
# Qwen2.5-VL pair emulated. First run ~1 h on 2 cores (the cross build); cached in ~/.cache/edge-runtime/arm64.
ARM64_PACKAGES := crossbuild-essential-arm64 qemu-user mmdebstrap cmake
.PHONY: test-arm64
test-arm64: venv export-deps
	@missing=""; for p in $(ARM64_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi
	$(BIN)/python build/arm64/test_arm64.py

# Slow, not part of `make test`: the robustness suites (large fuzzing runs, attacks, soak). Mark a
# slow test `@pytest.mark.robustness` (tests/robustness/ holds them) and it runs here, not in `make test`.
test-robustness: venv export-deps system-deps
	$(BIN)/python -m pytest -m robustness

# Slow, not part of `make test` (needs root and a Docker engine): builds the x86 image and waits for healthy.
test-image:
	@for p in docker.io debootstrap; do dpkg -s $$p >/dev/null 2>&1 || apt-get install -y -qq $$p >/dev/null; done
	l4t_docker/check_x86_image.sh

# Slow, not part of `make test` (needs root, a Docker engine and a registry): the OTA agent end to end.
test-ota: venv system-deps
	@for p in docker.io docker-registry busybox-static; do dpkg -s $$p >/dev/null 2>&1 || apt-get install -y -qq $$p >/dev/null; done
	@# goosebit (the DDI server of tests/ota/test_hawkbit_fleet.py) in its own venv: its web stack stays out of ours.
	test -x .venv-goosebit/bin/python || (python3 -m venv .venv-goosebit && .venv-goosebit/bin/pip install --quiet 'goosebit==0.2.12')
	EDGE_TEST_OTA=1 EDGE_GOOSEBIT_PYTHON=.venv-goosebit/bin/python $(BIN)/python -m pytest tests/ota

bench: venv
	$(BIN)/edge-runtime bench

# Slow, not part of `make test`: llama-server (built once from the llama.cpp our llama-cpp-python vendors,
# ~10 min on 2 cores, cached under ~/.cache/edge-runtime/llama-server) against our daemon on the real-weights
# Gemma 3 270M bench bundle, one server at a time (docs/benchmarks.md, "Peers side by side").
#   make bench-peers PEERS_ARGS="--workload both --out peers.json"
PEERS_BUNDLE ?= $(HOME)/.cache/edge-runtime/bench/siglip224-gemma270m
PEERS_ARGS ?=
.PHONY: bench-peers
# NeMo Guardrails in front of the daemon (examples/nemo-guardrails); its own venv: nemoguardrails
# 0.24.1 pins huggingface_hub < 2, which the export extra cannot take.
test-nemo: venv
	test -x .venv-nemo/bin/python || (python3 -m venv .venv-nemo && .venv-nemo/bin/pip install --quiet 'nemoguardrails==0.24.1')
	EDGE_NEMO_PYTHON=.venv-nemo/bin/python $(BIN)/python -m pytest tests/api/test_rails_nemo.py -q

bench-peers: venv
	@[ -f $(PEERS_BUNDLE)/bundle.yaml ] || { $(BIN)/pip install --quiet -e '.[bench]' && \
		$(BIN)/edge-runtime models bench siglip224-gemma270m $(PEERS_BUNDLE); }
	$(BIN)/python benchmarks/peers.py --bundle $(PEERS_BUNDLE) --threads $$(nproc) $(PEERS_ARGS)

# Regenerates the committed Sparkplug B payload code from our sparkplug_b.proto (written from the
# specification's field list) with grpcio-tools' protoc, in a scratch folder (nothing enters the venv).
# The generated code needs a protobuf runtime at least as new as its protoc (pyproject pins protobuf).
.PHONY: sparkplug-proto
sparkplug-proto: venv
	tmp=$$(mktemp -d) && $(BIN)/pip install --quiet --target $$tmp grpcio-tools==1.85.1 && \
	cd edge_runtime/lineio/sparkplug && PYTHONPATH=$$tmp $(CURDIR)/$(BIN)/python -m grpc_tools.protoc -I. \
		--python_out=. --pyi_out=. sparkplug_b.proto; status=$$?; rm -rf $$tmp; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
