"""Simulated BMCs in processes of their own, for benches that measure the client side alone.

Starts ``ferrum simulator`` K times, each with its share of the machines
(``--first-index`` keeps names, UUIDs and MACs apart), waits for each to
write its inventory, and hands back every machine's Redfish and (with
``ipmi``) IPMI driver_info. The bench process then holds only the
conductor's side: its sockets, threads and CPU are not the BMCs'.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 300.0


class BmcProcesses:
    def __init__(
        self,
        work: Path,
        *,
        machines: int,
        processes: int,
        ipmi: bool,
        username: str,
        password: str,
    ) -> None:
        self.work = work
        self.machines = machines
        self.processes = max(1, min(processes, machines))
        self.ipmi = ipmi
        self.username = username
        self.password = password
        self.popens: list[subprocess.Popen[bytes]] = []
        self.inventory: list[dict[str, Any]] = []

    async def start(self) -> None:
        per, extra = divmod(self.machines, self.processes)
        first = 0
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for i in range(self.processes):
            count = per + (1 if i < extra else 0)
            state = self.work / f"sim{i}"
            args = [
                sys.executable, "-m", "services.cli", "simulator",
                "--machines", str(count), "--first-index", str(first), "--state-dir", str(state),
                "--port", "0", "--disk-size", "1MiB", "--username", self.username, "--password", self.password,
                "--ports-file", str(self.work / f"sim{i}.ports.json"), "--log-level", "WARNING",
            ]  # fmt: skip
            if self.ipmi:
                args.append("--ipmi")
            with open(self.work / f"sim{i}.log", "ab") as out:
                self.popens.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
            first += count
        deadline = time.monotonic() + START_TIMEOUT
        for i, popen in enumerate(self.popens):
            ports = self.work / f"sim{i}.ports.json"
            while not (ports.exists() and ports.read_text()):
                if popen.poll() is not None or time.monotonic() > deadline:
                    log = (self.work / f"sim{i}.log").read_text()[-2000:]
                    raise RuntimeError(f"simulator {i} did not start: {log}")
                await asyncio.sleep(0.1)
            inventory = json.loads((self.work / f"sim{i}" / "machines.json").read_text())
            self.inventory.extend(inventory["machines"])

    def pids(self) -> list[int]:
        return [p.pid for p in self.popens]

    async def stop(self) -> None:
        for popen in self.popens:
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        for popen in self.popens:
            try:
                await asyncio.to_thread(popen.wait, 60)
            except subprocess.TimeoutExpired:
                popen.kill()
                await asyncio.to_thread(popen.wait, 5)
