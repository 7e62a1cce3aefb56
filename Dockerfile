# The one image every cdiflow workload runs (see deploy/k8s/).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cdi ./cdi
COPY orchestrator ./orchestrator
COPY workflows ./workflows
COPY cdiflow ./cdiflow
COPY loadtest ./loadtest
COPY dashboards ./dashboards
RUN pip install --no-cache-dir .
ENTRYPOINT ["cdiflow"]
