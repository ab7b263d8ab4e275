"""deploy/docker-compose.yml must be valid and only use real commands and options."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml

from services.cli import build_parser
from services.common.config import option_env_names

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
REQUIRED = {"postgres", "api", "conductor-1", "conductor-2", "ipxe", "objectstore", "simulator"}


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def ours(services: dict) -> dict[str, dict]:
    """Services built from this repository's deploy/Dockerfile."""
    found = {}
    for name, svc in services.items():
        build = svc.get("build")
        if build is None:
            continue
        dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
        assert dockerfile == "deploy/Dockerfile", f"service {name} builds from {dockerfile}, not deploy/Dockerfile"
        found[name] = svc
    return found


def argv_of(name: str, svc: dict) -> list[str]:
    command = svc.get("command")
    assert command, f"service {name} has no command"
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def environment_of(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...] form
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def test_docker_compose_validates_it() -> None:
    binary = shutil.which("docker-compose")
    assert binary, (
        "docker-compose is not on PATH: install Debian's docker-compose "
        "(apt-get install -y --no-install-recommends docker-compose) to validate deploy/docker-compose.yml"
    )
    env = {**os.environ, "POSTGRES_PASSWORD": "s3cret-admin", "FERRUM_DB_PASSWORD": "s3cret-ferrum"}
    result = subprocess.run(
        [binary, "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stdout}{result.stderr}"
    resolved = yaml.safe_load(result.stdout)["services"]
    assert "ferrum:s3cret-ferrum@postgres" in resolved["api"]["environment"]["FERRUM_DATABASE_URL"]


def test_docker_compose_refuses_to_run_without_passwords() -> None:
    """No default password: a stack brought up without choosing one must not start."""
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not on PATH"
    env = {k: v for k, v in os.environ.items() if k not in ("POSTGRES_PASSWORD", "FERRUM_DB_PASSWORD")}
    result = subprocess.run(
        [binary, "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert result.returncode != 0
    assert "PASSWORD" in result.stderr


def test_required_services_exist() -> None:
    services = load()["services"]
    missing = REQUIRED - set(services)
    assert not missing, f"deploy/docker-compose.yml lacks services {sorted(missing)}"
    assert "pg_isready" in str(services["postgres"].get("healthcheck", {}).get("test"))
    assert REQUIRED - {"postgres"} <= set(ours(services))


def parse(name: str, svc: dict):
    """The service's command parsed by the real CLI; argparse's exit becomes a failure."""
    argv = argv_of(name, svc)
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(
            f"service {name}: `ferrum {shlex.join(argv)}` is rejected by services.cli.build_parser() (exit {exc.code})"
        ) from None


def test_commands_parse_with_the_ferrum_cli() -> None:
    for name, svc in ours(load()["services"]).items():
        parse(name, svc)


def test_environment_names_are_ones_ferrum_reads() -> None:
    known = option_env_names()
    for name, svc in ours(load()["services"]).items():
        for variable in environment_of(svc):
            if variable.startswith("FERRUM_"):
                assert variable in known, f"service {name} sets {variable}, which Ferrum does not read"


def conductor_hostname(name: str, svc: dict) -> str:
    args = parse(name, svc)
    return getattr(args, "hostname", None) or environment_of(svc).get("FERRUM_CONDUCTOR_HOSTNAME", "")


def test_conductors_have_distinct_hostnames() -> None:
    services = load()["services"]
    names = [conductor_hostname(c, services[c]) for c in ("conductor-1", "conductor-2")]
    assert all(names), f"every conductor needs an explicit hostname, got {names}"
    assert names[0] != names[1], f"conductors share hostname {names[0]!r}"
