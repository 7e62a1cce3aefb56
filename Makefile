# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lock check lint typecheck imports bench browser kustomize nft proto clean native s3server \
  podman image test-image mosquitto

# The CDI minion (Rust) is built by installing the package (setup.py, setuptools-rust) into
# cdi/minion/bin/. Rust comes with rustup, often outside a non-login shell's PATH: put it there.
export PATH := $(if $(wildcard $(HOME)/.cargo/bin),$(HOME)/.cargo/bin:)$(PATH)
CARGO ?= $(shell command -v cargo 2>/dev/null || echo $(HOME)/.cargo/bin/cargo)
NATIVE_DIR := cdi/minion-native
MINION := cdi/minion/bin/cdi-minion
CLIENT_NATIVE_DIR := cdi/client-native
NATIVE_SOURCES := $(NATIVE_DIR)/Cargo.toml $(NATIVE_DIR)/Cargo.lock $(wildcard $(NATIVE_DIR)/src/*.rs) \
  $(CLIENT_NATIVE_DIR)/Cargo.toml $(CLIENT_NATIVE_DIR)/Cargo.lock $(wildcard $(CLIENT_NATIVE_DIR)/src/*.rs)

UV := $(BIN)/uv
# .venv holds exactly uv.lock (every extra, with the lock's hashes): `uv sync --frozen` never
# resolves, so a release elsewhere changes nothing here. uv itself comes from the lock too
# (tools/lockfile.py prints its pinned, hashed requirement for pip).
export UV_PYTHON_DOWNLOADS := never
# The editable install builds the minion (uv rebuilds it when its sources change: cache-keys).
$(STAMP): pyproject.toml uv.lock tools/lockfile.py setup.py $(NATIVE_SOURCES)
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(PYTHON) tools/lockfile.py uv-requirement > $(VENV)/uv-requirement.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
	  -r $(VENV)/uv-requirement.txt
	$(UV) sync --frozen --extra dev --quiet
	touch $(STAMP)

# Upgrades on purpose: the newest versions pyproject.toml's ranges allow, into uv.lock. Then run
# `make test` and commit uv.lock only once the whole suite passes on it.
lock: $(STAMP)
	$(UV) lock --upgrade
	$(UV) sync --frozen --extra dev
	@echo "uv.lock refreshed: run make test, and commit uv.lock once it passes"

# After changing the minion's Rust: the re-sync rebuilds it. Without Rust the install stops and
# says what to install.
native: $(STAMP)

# The embedded S3 endpoint: Versity's S3 gateway, built with Go into the venv (keep the version
# in step with orchestrator/services/s3.py). Without Go the build is skipped with a note: the
# stack then needs S3_ENDPOINT_URL.
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
VERSITYGW := $(BIN)/versitygw
VERSITYGW_MODULE := github.com/versity/versitygw/cmd/versitygw@v1.8.0
s3server: $(VERSITYGW)
$(VERSITYGW): | $(STAMP)
	@if [ -x "$(GO)" ]; then \
	  echo "building versitygw (the embedded S3 endpoint) with Go"; \
	  GOBIN="$(abspath $(BIN))" GOFLAGS=-modcacherw "$(GO)" install $(VERSITYGW_MODULE); \
	else echo "go not found: no embedded S3 endpoint (install Go, or set S3_ENDPOINT_URL)"; fi

demo: $(STAMP) s3server
	$(BIN)/cdiflow demo

# The dashboard tests drive Debian's Chromium (no browser download): install it when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	    else echo "chromium is missing: the browser tests will be skipped (run as root, or apt-get install chromium)"; fi; }

# The Kubernetes manifests are rendered by kustomize in the tests: kubectl's or kustomize's own
# when installed, else kustomize built from its Go module (skipped with a note without Go).
KUSTOMIZE_VERSION ?= v5.5.0
kustomize:
	@command -v kustomize >/dev/null 2>&1 || command -v kubectl >/dev/null 2>&1 || \
	  [ -x "$(HOME)/go/bin/kustomize" ] || \
	  { if [ -x "$(GO)" ]; then "$(GO)" install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION); \
	    else echo "neither kustomize, kubectl nor go: the manifest rendering test will be skipped"; fi; }

# The emulated link between hosts (cdi/link_emulator.py) turns connections with nft rules:
# install nftables when missing (as root), else its tests are skipped with the reason.
nft:
	@command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq nftables >/dev/null; \
	    else echo "nft is missing: the emulated-link tests will be skipped (run as root, or apt-get install nftables)"; fi; }

# The channels bench's MQTT peer is Debian's Mosquitto: installed when missing (as root; its
# rows say "not run" otherwise).
mosquitto:
	@[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq mosquitto >/dev/null; \
	    else echo "mosquitto is missing: the channels bench's MQTT rows will say not run (apt-get install mosquitto)"; fi; }

# The stack as containers and the Kubernetes manifests played with podman (tests/deploy/) need
# podman with runc, and debootstrap for the images' Debian base: installed when missing (as
# root; the container tests are skipped otherwise, with the reason).
podman:
	@{ command -v podman && command -v runc && command -v debootstrap; } >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq podman runc debootstrap >/dev/null; \
	    else echo "podman, runc or debootstrap is missing: the container tests will be skipped (run as root, or apt-get install podman runc debootstrap)"; fi; }

# The product's image and the services' (deploy/containers/images.py), built here with podman
# from Debian's packages, uv.lock and this tree; cached (a second build of an unchanged tree
# takes seconds). Needs root, the minion the install built (cargo) and versitygw (Go).
image: $(STAMP) s3server podman
	$(BIN)/python -m deploy.containers build

# What `make test` builds: the images where they can be built here, else a note (the tests
# that need them say why they are skipped).
test-image: $(STAMP) s3server podman
	@if [ "$$(id -u)" != 0 ] || ! command -v podman >/dev/null 2>&1; then \
	  echo "no root podman: the images are not built (the container tests will be skipped)"; \
	elif [ ! -x $(MINION) ] || [ ! -x $(VERSITYGW) ]; then \
	  echo "no minion or versitygw: the images are not built (the container tests will be skipped)"; \
	else $(BIN)/python -m deploy.containers build; fi

# The suite in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them so a
# module's stack starts once. Most of a test's time is spent waiting on the processes it
# started: on two cores a third worker still finds them idle part of the time.
TEST_WORKERS ?= 3
test: $(STAMP) s3server browser kustomize nft mosquitto test-image
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/lint-imports
	@if [ -x "$(CARGO)" ]; then "$(CARGO)" test --release --locked --quiet --manifest-path $(NATIVE_DIR)/Cargo.toml; fi
	@if [ -x "$(CARGO)" ]; then "$(CARGO)" test --release --locked --quiet --no-default-features \
	  --manifest-path $(CLIENT_NATIVE_DIR)/Cargo.toml; fi
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

check: lint typecheck imports

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	"$(CARGO)" fmt --check --manifest-path $(NATIVE_DIR)/Cargo.toml
	"$(CARGO)" clippy --release --locked --quiet --manifest-path $(NATIVE_DIR)/Cargo.toml -- -D warnings
	"$(CARGO)" fmt --check --manifest-path $(CLIENT_NATIVE_DIR)/Cargo.toml
	"$(CARGO)" clippy --release --locked --quiet --all-targets --manifest-path $(CLIENT_NATIVE_DIR)/Cargo.toml \
	  -- -D warnings

typecheck: $(STAMP)
	$(BIN)/mypy .

# The import contracts in pyproject.toml ([tool.importlinter]): which package may import which.
imports: $(STAMP)
	$(BIN)/lint-imports

# The set docs/benchmarks.md reports (hours on 2 cores: run it on a quiet machine, first field
# of /proc/loadavg below 1.0). JSON in $(BENCH_OUT), plots in docs/images/bench.
BENCH_OUT ?= .data/bench-results
BENCH := $(BIN)/cdiflow bench
PLOTS := --plots docs/images/bench
bench: $(STAMP) s3server mosquitto
	mkdir -p $(BENCH_OUT)
	$(BENCH) cdi --repeat 300 --backends tcp,grpc,cdi-shm,relay --json > $(BENCH_OUT)/cdi.json
	$(BENCH) images --size 2MB --json > $(BENCH_OUT)/images.json
	$(BENCH) s3 --sizes 10KB,2MB --json > $(BENCH_OUT)/s3.json
	$(BENCH) idle --seconds 40 --json > $(BENCH_OUT)/idle.json
	$(BENCH) history --sizes 10k,100k,1M --json > $(BENCH_OUT)/history.json
	$(BENCH) channels --json > $(BENCH_OUT)/channels.json
	$(BENCH) cache --rounds 2 --json > $(BENCH_OUT)/cache.json
	$(BENCH) ar --rounds 3 --json --plots docs/images/ar > $(BENCH_OUT)/ar.json
	$(BENCH) ar --hosts 2 --rounds 3 --json --plots docs/images/ar-hosts > $(BENCH_OUT)/ar-hosts.json
	$(BENCH) workflows --quick --json $(BENCH_OUT)/quick.json
	$(BENCH) workflows --scenario 1 --sizes 10KB,100KB,500KB,2MB --workflows 60 --rounds 3 \
	  --json $(BENCH_OUT)/scenario1.json $(PLOTS)
	$(BENCH) workflows --scenario 1 --sizes 10KB --workflows 300 --rounds 3 \
	  --systems floor,affinity,transfer,auto,celery,ray,conductor,temporal --json $(BENCH_OUT)/goals-10KB.json
	$(BENCH) workflows --scenario 1 --sizes 2MB --workflows 150 --rounds 3 \
	  --systems floor,floor-s3,affinity,auto,object-store,celery,ray,conductor,temporal \
	  --json $(BENCH_OUT)/goals-2MB.json
	$(BENCH) workflows --scenario 1 --sizes 10KB,2MB --workflows 60 --open-loop 0.5,0.8,0.95 \
	  --systems floor-s3,affinity,object-store,celery,ray,conductor,temporal --json $(BENCH_OUT)/open-loop.json
	$(BENCH) workflows --scenario 2 --workflows 60 --json $(BENCH_OUT)/scenario2.json $(PLOTS)
	$(BENCH) workflows --scenario 3 --workflows 60 --rounds 3 --json $(BENCH_OUT)/scenario3.json $(PLOTS)
	$(BENCH) workflows --scenario 1 --s3-link regional --sizes 10KB,100KB,500KB,2MB --workflows 60 \
	  --rounds 3 --json $(BENCH_OUT)/regional.json $(PLOTS)
	$(BENCH) workflows --hosts 2 --scenario 1 --sizes 10KB,100KB,500KB,2MB --workflows 60 \
	  --rounds 3 --json $(BENCH_OUT)/hosts2.json

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. cdi/proto/cdi.proto

clean:
	rm -rf $(VENV) .data .pytest_cache .mypy_cache .ruff_cache test-artifacts $(NATIVE_DIR)/target \
	  $(CLIENT_NATIVE_DIR)/target cdi/_hotpath*.so cdi/minion/bin build
