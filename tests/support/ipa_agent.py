"""The real ironic-python-agent (IPA) as a process, for the interop tests.

:func:`ensure_ipa_venv` installs ``ironic-python-agent`` (``IPA_VERSION``) from
PyPI into its own virtualenv, ``<repo>/.ferrum/cache/ipa-venv``: never into
Ferrum's environment, since IPA pins its own oslo libraries. ``scripts/bootstrap.sh``
calls it (``python -m tests.support.ipa_agent``) so the timed test run does not
pay for the install; a test that finds no venv creates it itself.

:func:`ipa_agent` starts IPA against an Ironic-compatible API (Ferrum's or
Ironic's) on a machine that ``tests/interop/ipa_machine.py`` describes: one
NIC with the node's MAC and one disk that is a sparse file. ``poweroff`` and
``reboot`` are shims on IPA's PATH that record the call (the machine "going
down"); IPA itself keeps running until the test stops it, by its PID.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common.ports import unused_tcp_port
from tests.support.peer_venv import ensure_peer_venv

LOG = logging.getLogger(__name__)

IPA_VERSION = "13.0.0"
REPO = Path(__file__).resolve().parents[2]
MACHINE = REPO / "tests" / "interop" / "ipa_machine.py"
STOP_TIMEOUT = 10.0


def ensure_ipa_venv(version: str = IPA_VERSION) -> Path:
    """A virtualenv with ironic-python-agent ``version``; its python. Reused when present."""
    return ensure_peer_venv("ipa", f"ironic-python-agent=={version}")


@dataclass
class IpaProcess:
    """One running IPA: where it listens and what it logged."""

    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log: Path
    shim_log: Path

    @property
    def listen_url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def shutdowns(self) -> list[str]:
        """``poweroff`` / ``reboot`` calls IPA made, in order."""
        if not self.shim_log.exists():
            return []
        return self.shim_log.read_text().split()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


# lsblk refuses a regular file ("not a block device"). After streaming a raw
# image IPA asks it for the disk's UUID/PARTUUID (disk_utils.block_uuid); this
# stand-in answers that one query for the file disk from blkid (which reads
# files), and hands every other call, and every real device, to lsblk itself.
LSBLK_SHIM = """#!/bin/sh
case " $* " in
*" --output UUID,PARTUUID "*)
    for arg in "$@"; do
        if [ -f "$arg" ]; then
            uuid=$(blkid -p -s UUID -o value "$arg" 2>/dev/null)
            echo "UUID=\\"$uuid\\" PARTUUID=\\"\\""
            exit 0
        fi
    done;;
esac
exec /usr/bin/lsblk "$@"
"""


def _write_shims(shims: Path, record: Path) -> None:
    shims.mkdir(parents=True, exist_ok=True)
    for name in ("poweroff", "reboot"):
        path = shims / name
        path.write_text(f'#!/bin/sh\necho {name} >> "{record}"\nexit 0\n')
        path.chmod(0o755)
    (shims / "lsblk").write_text(LSBLK_SHIM)
    (shims / "lsblk").chmod(0o755)


def write_config(path: Path, *, api_url: str, port: int) -> None:
    """IPA's config file: the api, a loopback listener, inspection off, fast lookups."""
    path.write_text(
        "[DEFAULT]\n"
        f"api_url = {api_url}\n"
        "listen_host = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "advertise_host = 127.0.0.1\n"
        f"advertise_port = {port}\n"
        "inspection_callback_url =\n"
        "inspection_collectors =\n"
        "lookup_interval = 1\n"
        "lookup_timeout = 120\n"
        "hardware_initialization_delay = 0\n"
        "debug = true\n"
        "use_stderr = true\n"
    )


@contextlib.contextmanager
def ipa_agent(api_url: str, *, mac: str, disk: Path, workdir: Path, python: Path | None = None) -> Iterator[IpaProcess]:
    """Run IPA for the machine with ``mac`` and the file ``disk``; stop it by PID on exit."""
    python = python or ensure_ipa_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    shims = workdir / "shims"
    shim_log = workdir / "shutdowns.log"
    _write_shims(shims, shim_log)
    port = unused_tcp_port()
    config = workdir / "ipa.conf"
    write_config(config, api_url=api_url, port=port)
    log = workdir / "ipa.log"
    env = {
        "PATH": f"{shims}:{python.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "FERRUM_IPA_MAC": mac,
        "FERRUM_IPA_DISK": str(disk),
        "FERRUM_IPA_SHIMS": str(shims),
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(python), str(MACHINE), "--config-file", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    ipa = IpaProcess(proc=proc, port=port, workdir=workdir, log=log, shim_log=shim_log)
    try:
        yield ipa
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":  # scripts/bootstrap.sh: install now, not in the timed test run
    print(json.dumps({"python": str(ensure_ipa_venv())}))
