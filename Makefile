# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check lint typecheck bench browser proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cdiflow demo

# The dashboard tests drive Debian's Chromium (no browser download): install it when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	    else echo "chromium is missing: the browser tests will be skipped (run as root, or apt-get install chromium)"; fi; }

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/pytest

check: lint typecheck

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy .

# The full set (hours on 2 cores: scenario 2 runs 500 concurrent workflows per system).
BENCH_OUT ?= .data/bench-results
bench: $(STAMP)
	mkdir -p $(BENCH_OUT)
	$(BIN)/cdiflow bench cdi --json > $(BENCH_OUT)/cdi.json
	$(BIN)/cdiflow bench workflows --quick --json $(BENCH_OUT)/quick.json
	$(BIN)/cdiflow bench workflows --scenario all --json $(BENCH_OUT)/loopback.json --plots $(BENCH_OUT)/plots
	$(BIN)/cdiflow bench workflows --scenario 1 --s3-link regional --json $(BENCH_OUT)/regional.json --plots $(BENCH_OUT)/plots

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. cdi/proto/cdi.proto

clean:
	rm -rf $(VENV) .data .pytest_cache .mypy_cache .ruff_cache test-artifacts
