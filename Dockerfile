# The one image every cdiflow workload runs (see deploy/k8s/).

# The native CDI minion (Rust); the image's `cdiflow cdi minion` finds it on PATH.
FROM rust:1-slim-bookworm AS minion
WORKDIR /src
COPY cdi/minion-native ./
RUN cargo build --release --locked

FROM python:3.11-slim-bookworm
WORKDIR /app
COPY --from=minion /src/target/release/cdi-minion /usr/local/bin/cdi-minion
COPY pyproject.toml README.md ./
COPY cdi ./cdi
COPY orchestrator ./orchestrator
COPY workflows ./workflows
COPY cdiflow ./cdiflow
COPY dashboards ./dashboards
# The `ar` extra (PyAV, OpenCV) lets workers run the bundled ar_video workflow.
RUN pip install --no-cache-dir '.[ar]'
ENTRYPOINT ["cdiflow"]
