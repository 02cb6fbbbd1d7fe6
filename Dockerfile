# The example judge app's image: its API (uvicorn), dispatcher, workers and reaper all run
# from it (docker-compose.yml); the runtime's processes and the API run as an unprivileged user.
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY durable_tasks ./durable_tasks
COPY examples ./examples
# examples: the judge's FastAPI app; web: uvicorn, which serves it (the compose file's api service).
RUN pip install --no-cache-dir '.[examples,web]' opentelemetry-sdk opentelemetry-exporter-otlp opentelemetry-distro
# The code stays root's and read-only; the processes run as `app`, whose home holds the only
# files they write (an embedded default's data_dir, when no URLs are given).
RUN useradd --create-home --uid 10001 --user-group app
USER app
ENV PYTHONPATH=/app DT_DATA_DIR=/home/app/.durable_tasks
# OTLP to the collector; opentelemetry-instrument installs the SDK from these variables.
ENV OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp OTEL_LOGS_EXPORTER=none
CMD ["opentelemetry-instrument", "durable-tasks", "run", "examples.judge.main:app"]
