"""openstacksdk's own bare-metal functional suite, run unmodified against a fresh Ferrum.

The suite ships inside the openstacksdk wheel
(``openstack/tests/functional/baremetal``) and is what the SDK's gate runs
against a real Ironic, so it checks Ferrum against expectations Ferrum did
not write. It leaves nodes behind, so it gets this module's fresh database
(``tests/conftest.py``) and an in-process stack of its own.

The suite reads its clouds from ``clouds.yaml`` by the names devstack's
gate uses (``devstack``, ``devstack-alt``, ``devstack-admin``,
``devstack-system-admin``); all four point at the stack with
``auth_type: none``. It runs in a child pytest that reports with
``--junitxml``, and the test passes when nothing failed or errored and every
skip is the suite's own "does not provide microversion" skip, for the
versions Ferrum does not advertise yet.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import openstack
import pytest

SUITE = Path(openstack.__file__).parent / "tests" / "functional" / "baremetal"
CLOUD_NAMES = ("devstack", "devstack-alt", "devstack-admin", "devstack-system-admin")
ALL_TESTS = 96  # openstack/tests/functional/baremetal in openstacksdk 4.x (a newer one may add more)


@dataclass
class SuiteReport:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def clouds_yaml(endpoint: str) -> str:
    """Every cloud the suite asks for, unauthenticated, at ``endpoint``."""
    entry = (
        "  {name}:\n    auth_type: none\n    auth:\n      endpoint: {endpoint}\n"
        "    baremetal_endpoint_override: {endpoint}\n    has_compute: false\n    has_image: false\n"
    )
    return "clouds:\n" + "".join(entry.format(name=name, endpoint=endpoint) for name in CLOUD_NAMES)


def read_junit(path: Path) -> SuiteReport:
    """Sort each test case of a JUnit XML report by its outcome."""
    report = SuiteReport()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            failure = case.find("failure") if case.find("failure") is not None else case.find("error")
            assert failure is not None
            report.failed.append(f"{name}: {(failure.get('message') or '')[:300]}")
        elif skipped is not None:
            report.skipped[name] = skipped.get("message") or ""
        else:
            report.passed.append(name)
    return report


@pytest.mark.timeout(900)
async def test_openstacksdk_baremetal_functional_suite(stack, tmp_path: Path) -> None:
    endpoint = stack.endpoints["api REST (Ironic v1)"]
    config = tmp_path / "clouds.yaml"
    config.write_text(clouds_yaml(endpoint))
    junit = tmp_path / "junit.xml"
    env = {
        **os.environ,
        "OS_CLIENT_CONFIG_FILE": str(config),
        "OS_CLOUD": "devstack-admin",
        "OPENSTACKSDK_FUNC_TEST_TIMEOUT": "60",
        # openstacksdk's own default per test is 5 s (openstack/tests/base.py), less than two of
        # its 2 s polls; its functional gate runs with a longer one, as here.
        "OS_TEST_TIMEOUT": "60",
    }
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=", "-o", "asyncio_mode=strict"),
        *("--rootdir", str(SUITE), "--basetemp", str(tmp_path / "suite-tmp"), f"--junitxml={junit}"),
        str(SUITE),
        cwd=str(tmp_path),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 800)
    elapsed = time.monotonic() - started
    report = read_junit(junit)
    print(
        f"openstacksdk functional: {len(report.passed)} passed, {len(report.failed)} failed, "
        f"{len(report.skipped)} skipped in {elapsed:.0f} s"
    )
    assert not report.failed, "\n".join(report.failed) + "\n" + output.decode()[-4000:]
    # Ferrum advertises 1.115, Ironic 39's maximum: every test runs, none is skipped for its version.
    assert not report.skipped, report.skipped
    assert len(report.passed) >= ALL_TESTS, (len(report.passed), output.decode()[-4000:])
