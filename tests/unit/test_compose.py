"""deploy/docker-compose.yml must be valid and only use real commands and options."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import yaml

from services.cli import build_parser
from services.common.config import option_env_names

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_docker_compose_validates_it() -> None:
    binary = shutil.which("docker-compose")
    assert binary, "install Debian's docker-compose (scripts/bootstrap.sh does) to validate deploy/docker-compose.yml"
    result = subprocess.run([binary, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_services_use_real_commands_and_options() -> None:
    services = load()["services"]
    assert {"postgres", "api", "conductor-1", "conductor-2", "ipxe", "objectstore", "simulator"} <= set(services)
    known = option_env_names()
    ours = [name for name, svc in services.items() if "build" in svc]
    assert len(ours) >= 7
    for name in ours:
        svc = services[name]
        command = svc["command"]
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"service {name}: `ferrum {' '.join(argv)}` is not a valid command") from exc
        for variable in svc.get("environment") or {}:
            if variable.startswith("FERRUM_"):
                assert variable in known, f"service {name} sets {variable}, which Ferrum does not read"
    hostnames = {services[c]["command"][services[c]["command"].index("--hostname") + 1] for c in ("conductor-1", "conductor-2")}
    assert len(hostnames) == 2
