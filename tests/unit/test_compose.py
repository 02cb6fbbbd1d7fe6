"""docker-compose.yml is parsed (no Docker engine here): services exist and every DT_ variable
names a real setting with a value the settings model accepts."""

from __future__ import annotations

import re
import tomllib
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


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each line of the Dockerfile, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and not line.startswith("#"))
    ]


def test_the_image_runs_as_an_unprivileged_user() -> None:
    users = [args for instruction, args in dockerfile_instructions() if instruction == "USER"]
    assert users, "the Dockerfile sets no USER: its processes would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    # the user the last USER names is created in the image
    assert any(instruction == "RUN" and users[-1] in args for instruction, args in dockerfile_instructions())


def test_the_image_installs_uvicorn_for_the_api_service() -> None:
    steps = dockerfile_instructions()
    installs = [args for instruction, args in steps if instruction == "RUN" and "pip install" in args]
    extras = {e for args in installs for group in re.findall(r"\.\[([a-z,\-]+)\]", args) for e in group.split(",")}
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = [requirement for extra in extras for requirement in optional[extra]]
    assert any(r.startswith("uvicorn") for r in installed), f"no extra of {sorted(extras)} installs uvicorn"
    assert any(r.startswith("fastapi") for r in installed)


def test_the_api_service_serves_the_judge_api_with_uvicorn() -> None:
    argv = compose()["services"]["api"]["command"]
    assert argv[argv.index("uvicorn") + 1] == "examples.judge.main:api"
    assert "build" in compose()["services"]["api"]  # from this image (the x-app anchor)


def test_app_services_wait_for_the_schema() -> None:
    services = compose()["services"]
    init = services["init-db"]
    assert init["command"][-1] == "init-db"
    assert init["restart"] == "no"
    for name in ("api", "dispatcher", "worker", "reaper"):
        assert services[name]["depends_on"]["init-db"] == {"condition": "service_completed_successfully"}, name
