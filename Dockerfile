# The example judge app's image: dispatcher, workers and reaper all run from it.
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY durable_tasks ./durable_tasks
COPY examples ./examples
RUN pip install --no-cache-dir '.[examples]' opentelemetry-sdk opentelemetry-exporter-otlp opentelemetry-distro
ENV PYTHONPATH=/app
# OTLP to the collector; opentelemetry-instrument installs the SDK from these variables.
ENV OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp OTEL_LOGS_EXPORTER=none
CMD ["opentelemetry-instrument", "durable-tasks", "run", "examples.judge.main:app"]
