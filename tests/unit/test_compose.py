"""docker-compose.yml is parsed (no Docker engine here): services exist and every DT_ variable
names a real setting with a value the settings model accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from durable_tasks import Settings

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_the_stack_has_every_service() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "otel-collector", "jaeger", "dispatcher", "worker", "reaper"} <= set(services)


def test_redis_keeps_data_and_never_evicts() -> None:
    command = compose()["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_every_dt_variable_is_a_setting_and_validates() -> None:
    fields = set(Settings.model_fields)
    for name in ("dispatcher", "worker", "reaper"):
        env = compose()["services"][name]["environment"]
        dt = {k: v for k, v in env.items() if k.startswith("DT_")}
        assert {"DT_DATABASE_URL", "DT_REDIS_URL", "DT_NAMESPACE"} <= set(dt), name
        for key in dt:
            assert key.removeprefix("DT_").lower() in fields, key
        settings = Settings.model_validate({k.removeprefix("DT_").lower(): v for k, v in dt.items()})
        assert settings.redis_url == "redis://redis:6379/0"


def test_app_services_run_the_runtime_commands_on_the_example_app() -> None:
    services = compose()["services"]
    for name, command in (("dispatcher", "dispatcher"), ("worker", "worker"), ("reaper", "reaper")):
        argv = services[name]["command"]
        assert argv[argv.index("durable-tasks") + 1] == command
        assert argv[-1] == "examples.judge.main:app"
    collector = yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    assert "otlp" in collector["receivers"]
