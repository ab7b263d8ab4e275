"""The agent's command API refuses malformed commands the way IPA does
(issue 16, item 10): 400 for a body, name, params, step or argument it
cannot use, 404 for an unknown extension, never 500. A refusal records no
command and leaves the agent free for the next one.

A real agent and a small Ironic-style api (``FakeIronic``) run in a thread
of their own, so table cases and hypothesis examples are plain HTTP calls.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.agent.agent import Agent, AgentOptions, Disk
from services.common.aiohttp_serving import start_http_site
from tests.integration.test_agent_deploy import TOKEN, FakeIronic

MiB = 1024 * 1024
# Well-formed image_info; the cases below break one field each. Port 9 refuses at once.
VALID_IMAGE = {"id": "img", "urls": ["http://127.0.0.1:9/img.raw"], "os_hash_algo": "sha256", "os_hash_value": "a" * 64}


class AgentThread:
    """An agent, and the api it looks itself up on, in an event loop on a thread of its own."""

    def __init__(self, disk: Path) -> None:
        self.disk = disk
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agent-under-test", daemon=True)
        self.agent: Agent | None = None
        self.runner: Any = None

    def start(self) -> str:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> str:
        ironic = FakeIronic()
        self.runner, port = await start_http_site(ironic.app(), "127.0.0.1", 0)
        mac = "52:54:00:00:00:42"
        ironic.register(mac)
        self.agent = Agent(
            AgentOptions(
                api_url=f"http://127.0.0.1:{port}",
                macs=(mac,),
                disks=(Disk(str(self.disk)),),
                lookup_interval=0.05,
                heartbeat_interval=30,
            )
        )
        await self.agent.start()
        await asyncio.wait_for(self.agent.looked_up.wait(), 20)
        return self.agent.callback_url

    def stop(self) -> None:
        async def stop() -> None:
            if self.agent is not None:
                await self.agent.stop()
            if self.runner is not None:
                await self.runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    disk = tmp_path_factory.mktemp("agent") / "sda.img"
    with open(disk, "wb") as fh:
        fh.truncate(4 * MiB)
    running = AgentThread(disk)
    try:
        yield running.start()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def post(http: requests.Session, url: str, body: bytes) -> requests.Response:
    return http.post(
        f"{url}/v1/commands/",
        params={"agent_token": TOKEN},
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )


def commands(http: requests.Session, url: str) -> list[dict[str, Any]]:
    response = http.get(f"{url}/v1/commands/", params={"agent_token": TOKEN}, timeout=30)
    assert response.status_code == 200
    return list(response.json()["commands"])


def settle(http: requests.Session, url: str) -> None:
    """Wait (bounded) until no command runs, so the next case is not answered 409."""
    deadline = time.monotonic() + 30
    while any(c["command_status"] == "RUNNING" for c in commands(http, url)):
        assert time.monotonic() < deadline, "a command kept running"
        time.sleep(0.05)


def assert_refused(response: requests.Response, status: int) -> dict[str, Any]:
    """IPA's error answer: the status, JSON ``{faultcode, faultstring}``."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"faultcode", "faultstring"}, body
    assert body["faultcode"] == ("Client" if status < 500 else "Server")
    assert isinstance(body["faultstring"], str) and body["faultstring"]
    return dict(body)


def command_body(name: Any, params: Any) -> bytes:
    return json.dumps({"name": name, "params": params}).encode()


def deploy_step(step: Any) -> bytes:
    return command_body("deploy.execute_deploy_step", {"step": step, "node": {}, "ports": []})


BAD_BODIES: list[tuple[str, bytes, int, str]] = [
    ("not JSON", b"{name: 1", 400, "not valid JSON"),
    ("not UTF-8", b'{"name": "\xff\xfe"}', 400, "not valid JSON"),
    ("nested too deep", b"[" * 100_000 + b"]" * 100_000, 400, "not valid JSON"),
    ("an integer too long to parse", b'{"name": 1' + b"1" * 5000 + b"}", 400, "not valid JSON"),
    ("empty", b"", 400, "name or params"),
    ("a list", b"[]", 400, "name or params"),
    ("a string", b'"standby.sync"', 400, "name or params"),
    ("no params", b'{"name": "standby.sync"}', 400, "name or params"),
    ("no name", b'{"params": {}}', 400, "name or params"),
    ("name not a string", command_body(["standby.sync"], {}), 400, "name or params"),
    ("params not an object", command_body("standby.sync", []), 400, "params"),
    ("name without an extension", command_body("sync", {}), 400, "Invalid command"),
    ("empty name", command_body("", {}), 400, "Invalid command"),
    ("empty command part", command_body("standby.", {}), 400, "Invalid command"),
    ("unknown command of a known extension", command_body("deploy.nothing", {}), 400, "Unknown command"),
    ("unknown extension", command_body("nope.nothing", {}), 404, "Unknown command"),
]

BAD_PARAMS: list[tuple[str, bytes, str]] = [
    ("no step", command_body("deploy.execute_deploy_step", {"node": {}}), "'step'"),
    ("step is a list", deploy_step(["write_image"]), "'step'"),
    ("step is a string", deploy_step("write_image"), "'step'"),
    ("step is null", deploy_step(None), "'step'"),
    ("step without a name", deploy_step({"interface": "deploy"}), "'step'"),
    ("step name is a list", deploy_step({"step": ["write_image"]}), "step"),
    ("step name is an object", deploy_step({"step": {"write_image": 1}}), "step"),
    ("step name is a number", deploy_step({"step": 7}), "step"),
    ("interface is a list", deploy_step({"step": "write_image", "interface": ["deploy"]}), "interface"),
    ("unknown step", deploy_step({"step": "format_disk", "interface": "deploy"}), "unknown deploy step"),
    ("args is a string", deploy_step({"step": "write_image", "args": "image"}), "args"),
    ("args is a list", deploy_step({"step": "write_image", "args": [VALID_IMAGE]}), "args"),
    ("args is a number", deploy_step({"step": "write_image", "args": 3}), "args"),
    ("no image_info", deploy_step({"step": "write_image", "args": {}}), "image_info"),
    ("image_info is a list", deploy_step({"step": "write_image", "args": {"image_info": []}}), "image_info"),
    (
        "configdrive is a number",
        deploy_step({"step": "write_image", "args": {"image_info": VALID_IMAGE, "configdrive": 5}}),
        "configdrive",
    ),
    (
        "image URL with a broken IPv6 host",
        deploy_step({"step": "write_image", "args": {"image_info": {**VALID_IMAGE, "urls": ["http://[::1/x"]}}}),
        "URL",
    ),
    (
        "checksum URL with a broken IPv6 host",
        command_body(
            "standby.prepare_image",
            {"image_info": {"id": "i", "urls": ["http://192.0.2.1/i"], "checksum": "http://[::1/sums"}},
        ),
        "checksum",
    ),
    (
        "hash value is a list",
        command_body("standby.prepare_image", {"image_info": {**VALID_IMAGE, "os_hash_value": ["a" * 64]}}),
        "os_hash_value",
    ),
    (
        "hash value of the wrong length",
        command_body("standby.prepare_image", {"image_info": {**VALID_IMAGE, "os_hash_value": "abc"}}),
        "os_hash_value",
    ),
    (
        "hash algorithm without a value",
        command_body(
            "standby.prepare_image", {"image_info": {**{k: v for k, v in VALID_IMAGE.items() if k != "os_hash_value"}}}
        ),
        "os_hash",
    ),
    (
        "image id is an object",
        command_body("standby.prepare_image", {"image_info": {**VALID_IMAGE, "id": {"a": 1}}}),
        "id",
    ),
    ("clean step is a list", command_body("clean.execute_clean_step", {"step": []}), "clean step"),
    ("clean step name is a list", command_body("clean.execute_clean_step", {"step": {"step": []}}), "clean step"),
    ("clean step name is an object", command_body("clean.execute_clean_step", {"step": {"step": {}}}), "clean step"),
]


@pytest.mark.parametrize(("case", "body", "status", "words"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_malformed_requests_are_refused_like_ipa(
    agent_url: str, http: requests.Session, case: str, body: bytes, status: int, words: str
) -> None:
    before = commands(http, agent_url)
    fault = assert_refused(post(http, agent_url, body), status)
    assert words in fault["faultstring"], fault
    assert commands(http, agent_url) == before  # nothing recorded, nothing started


@pytest.mark.parametrize(("case", "body", "words"), BAD_PARAMS, ids=[c[0] for c in BAD_PARAMS])
def test_malformed_params_are_400_invalid_command_parameters(
    agent_url: str, http: requests.Session, case: str, body: bytes, words: str
) -> None:
    before = commands(http, agent_url)
    fault = assert_refused(post(http, agent_url, body), 400)
    assert fault["faultstring"].startswith("Invalid command parameters: "), fault  # IPA's InvalidCommandParamsError
    assert words in fault["faultstring"], fault
    assert commands(http, agent_url) == before


def test_other_http_errors_keep_ipa_json_shape(agent_url: str, http: requests.Session) -> None:
    assert_refused(http.get(f"{agent_url}/v1/nowhere", timeout=30), 404)
    assert_refused(http.put(f"{agent_url}/v1/commands/", params={"agent_token": TOKEN}, timeout=30), 405)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
NAMES = st.sampled_from(
    ["deploy.execute_deploy_step", "standby.prepare_image", "clean.execute_clean_step", "deploy.get_deploy_steps"]
)
STEP_NAMES = st.sampled_from(["write_image", "erase_devices_metadata", "erase_devices", ""]) | JSON
# Never a usable checksum (no URL, never a hash's length), so no example starts a
# download; every other field may be right, to reach the checks behind them.
NOT_A_HASH_LENGTH = st.integers(0, 130).filter(lambda n: n not in (32, 64, 96, 128))
IMAGE_INFO = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON | st.just("img"),
        "urls": JSON | st.just(VALID_IMAGE["urls"]) | st.just(["http://[::1/x"]) | st.lists(st.text(max_size=30)),
        "checksum": JSON | NOT_A_HASH_LENGTH.flatmap(lambda n: st.text("0123456789abcdef:/[]", min_size=n, max_size=n)),
        "os_hash_algo": JSON | st.sampled_from(["sha256", "sha512", "md5", "crc32", "SHA256"]),
        "os_hash_value": JSON
        | NOT_A_HASH_LENGTH.flatmap(lambda n: st.text("0123456789abcdef", min_size=n, max_size=n)),
        "disk_format": JSON,
    },
)
ARGS = st.fixed_dictionaries({}, optional={"image_info": IMAGE_INFO | JSON, "configdrive": JSON}) | JSON
STEP = (
    st.fixed_dictionaries(
        {}, optional={"step": STEP_NAMES, "interface": st.just("deploy") | JSON, "args": ARGS, "priority": JSON}
    )
    | JSON
)
PARAMS = st.fixed_dictionaries(
    {}, optional={"step": STEP, "image_info": IMAGE_INFO | JSON, "node": JSON, "ports": JSON}
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES | JSON, params=PARAMS | JSON)
def test_no_command_body_gets_a_500(agent_url: str, http: requests.Session, name: Any, params: Any) -> None:
    before = commands(http, agent_url)
    response = post(http, agent_url, command_body(name, params))
    assert response.status_code in (200, 400, 404), (response.status_code, response.text[:500])
    if response.status_code == 200:  # a well-formed command ran (a clean step on the test disk, say)
        settle(http, agent_url)
        return
    assert_refused(response, response.status_code)
    assert commands(http, agent_url) == before
