# The one image every cdiflow workload runs (see deploy/k8s/).

# The CDI minion (Rust), built in a stage of its own: the Python stage has no Rust toolchain.
FROM rust:1-slim-bookworm AS minion
WORKDIR /src
COPY cdi/minion-native ./
RUN cargo build --release --locked

FROM python:3.11-slim-bookworm
WORKDIR /app
COPY --from=minion /src/target/release/cdi-minion /usr/local/bin/cdi-minion
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY cdi ./cdi
COPY orchestrator ./orchestrator
COPY workflows ./workflows
COPY cdiflow ./cdiflow
COPY dashboards ./dashboards
# The `ar` extra (PyAV, OpenCV) lets workers run the bundled ar_video workflow.
# CDI_MINION_BIN: the install ships the minion built above instead of building it (setup.py).
RUN CDI_MINION_BIN=/usr/local/bin/cdi-minion pip install --no-cache-dir '.[ar]'
ENTRYPOINT ["cdiflow"]
