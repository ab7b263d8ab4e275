"""Ironic's inspection rules (API 1.96) as Ferrum evaluates them: validation
with Ironic's messages, conditions (with loops and inversion), actions on
the node, its ports, traits and plugin data, priorities, and ``fail``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from services.common import errors
from services.common.inspection_rules import InspectionRuleFailure, RuleTarget, apply_rules, validate_rule

INVENTORY: dict[str, Any] = {
    "cpu": {"count": 8, "architecture": "x86_64", "model_name": "Xeon"},
    "memory": {"physical_mb": 16384},
    "interfaces": [
        {"name": "eth0", "mac_address": "52:54:00:00:00:01", "ipv4_address": "192.0.2.10", "has_carrier": True},
        {"name": "eth1", "mac_address": "52:54:00:00:00:02", "ipv4_address": None, "has_carrier": False},
    ],
    "bmc_address": "192.0.2.200",
    "system_vendor": {"manufacturer": "Dell Inc.", "product_name": "R650"},
}
PORT = "3c1b1f1e-0000-4000-8000-000000000001"


def target() -> RuleTarget:
    return RuleTarget(
        node={"uuid": "n-1", "properties": {"capabilities": "boot_mode:uefi"}, "driver_info": {"x": "y"}, "extra": {}},
        inventory=copy.deepcopy(INVENTORY),
        plugin_data={"root_disk": {"name": "/dev/sda"}},
        ports={PORT: {"uuid": PORT, "address": "52:54:00:00:00:01", "extra": {}}},
        traits=["CUSTOM_OLD"],
    )


def rule(conditions: list[dict[str, Any]], actions: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"conditions": conditions, "actions": actions, **fields}


async def test_a_rule_whose_conditions_hold_changes_node_traits_ports_and_plugin_data() -> None:
    t = target()
    applied = await apply_rules(
        [
            rule(
                [
                    # interpolated values are strings, as in Ironic: compare strings
                    {"op": "eq", "args": {"values": ["{inventory[cpu][count]}", "8"]}},
                    {"op": "eq", "args": {"values": ["{inventory[cpu][architecture]}", "x86_64"]}},
                    {"op": "in-net", "args": {"address": "{inventory[bmc_address]}", "subnet": "192.0.2.0/24"}},
                    {
                        "op": "matches",
                        "args": {"value": "{inventory[system_vendor][manufacturer]}", "regex": "Dell.*"},
                    },  # a full match,
                ],
                [
                    {
                        "op": "set-attribute",
                        "args": {"path": "/properties/cpu_model", "value": "{inventory[cpu][model_name]}"},
                    },
                    {"op": "set-capability", "args": {"name": "vendor", "value": "dell"}},
                    {"op": "add-trait", "args": {"name": "CUSTOM_BIG"}},
                    {"op": "remove-trait", "args": {"name": "CUSTOM_OLD"}},
                    {"op": "set-port-attribute", "args": {"port_id": PORT, "path": "extra/rack", "value": "r1"}},
                    {"op": "extend-plugin-data", "args": {"path": "tags", "value": "checked", "unique": True}},
                    {"op": "extend-plugin-data", "args": {"path": "tags", "value": "checked", "unique": True}},
                    {"op": "unset-plugin-data", "args": {"path": "root_disk.name"}},
                    {"op": "log", "args": {"msg": "node {node.uuid} has {inventory[cpu][count]} CPUs"}},
                ],
                uuid="r-big",
            )
        ],
        t,
    )
    assert applied == ["r-big"]
    assert t.node["properties"]["cpu_model"] == "Xeon"
    assert t.node["properties"]["capabilities"] == "boot_mode:uefi,vendor:dell"
    assert t.traits == ["CUSTOM_BIG"]
    assert t.ports[PORT]["extra"] == {"rack": "r1"}
    assert t.plugin_data == {"tags": ["checked"]}  # root_disk left empty, so dropped
    assert t.log == ["node n-1 has 8 CPUs"]


async def test_a_false_condition_stops_the_rule_and_inversion_and_loops_work() -> None:
    t = target()
    macs = [{"mac": i["mac_address"], "carrier": i["has_carrier"]} for i in INVENTORY["interfaces"]]
    applied = await apply_rules(
        [
            rule([{"op": "eq", "args": {"values": ["{inventory[cpu][count]}", "2"]}}], [{"op": "add-trait", "args": {"name": "CUSTOM_SMALL"}}], uuid="small"),
            rule([{"op": "!is-empty", "args": {"value": "{inventory[bmc_address]}"}}], [{"op": "add-trait", "args": {"name": "CUSTOM_BMC"}}], uuid="bmc"),
            rule([{"op": "is-true", "args": {"value": "{item[carrier]}"}, "loop": macs, "multiple": "all"}], [{"op": "add-trait", "args": {"name": "CUSTOM_ALL_LINKED"}}], uuid="all"),
            rule([{"op": "is-true", "args": {"value": "{item[carrier]}"}, "loop": macs, "multiple": "any"}], [{"op": "extend-attribute", "args": {"path": "extra/linked", "value": "{item[mac]}"}, "loop": macs}], uuid="any"),
        ],
        t,
    )  # fmt: skip
    assert applied == ["bmc", "any"]
    assert t.traits == ["CUSTOM_OLD", "CUSTOM_BMC"]
    assert t.node["extra"]["linked"] == ["52:54:00:00:00:01", "52:54:00:00:00:02"]


async def test_rules_run_by_priority_and_secrets_are_masked() -> None:
    t = target()
    t.inventory["bmc_password"] = "hunter2"  # type: ignore[index]
    await apply_rules(
        [
            rule([], [{"op": "set-attribute", "args": {"path": "extra/order", "value": "low"}}], priority=1),
            rule([], [{"op": "set-attribute", "args": {"path": "extra/order", "value": "high"}}], priority=50),
            rule([], [{"op": "set-attribute", "args": {"path": "extra/seen", "value": "{inventory[bmc_password]}"}}]),
        ],
        t,
    )
    assert t.node["extra"]["order"] == "low"  # the high-priority rule ran first, the low one last
    assert t.node["extra"]["seen"] == "***"


async def test_fail_and_broken_actions_fail_the_inspection() -> None:
    with pytest.raises(InspectionRuleFailure, match="too few CPUs"):
        await apply_rules([rule([], [{"op": "fail", "args": {"msg": "too few CPUs"}}])], target())
    with pytest.raises(InspectionRuleFailure, match="could not be checked"):  # "8" < 4: str and int
        await apply_rules([rule([{"op": "lt", "args": {"values": ["{inventory[cpu][count]}", 4]}}], [])], target())
    with pytest.raises(InspectionRuleFailure, match="set-port-attribute"):
        await apply_rules(
            [rule([], [{"op": "set-port-attribute", "args": {"port_id": "nope", "path": "extra/x", "value": 1}}])],
            target(),
        )
    with pytest.raises(InspectionRuleFailure, match="is not a list"):
        await apply_rules(
            [rule([], [{"op": "extend-attribute", "args": {"path": "driver_info/x", "value": 1}}])], target()
        )


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (rule([], []), "actions is required"),
        (rule([{"op": "bigger", "args": {}}], [{"op": "fail", "args": {"msg": "x"}}]), "Unsupported condition operator: bigger"),
        (rule([{"op": "!!eq", "args": {"values": []}}], [{"op": "fail", "args": {"msg": "x"}}]), "Multiple exclamation marks"),
        (rule([], [{"op": "!fail", "args": {"msg": "x"}}]), "Unsupported action operator: !fail"),
        (rule([], [{"op": "set-attribute", "args": {"path": "/a"}}]), "missing required argument(s): value"),
        (rule([], [{"op": "fail", "args": {"msg": "x", "extra": 1}}]), "unexpected argument(s): extra"),
        ({**rule([], [{"op": "fail", "args": {"msg": "x"}}]), "priority": 10000}, "Priority must be between 0 and 9999"),
        ({**rule([], [{"op": "fail", "args": {"msg": "x"}}]), "phase": "early"}, "Invalid phase: early"),
        ({**rule([], [{"op": "fail", "args": {"msg": "x"}}]), "colour": "red"}, "Additional properties are not allowed (colour)"),
    ],
)  # fmt: skip
def test_invalid_rules_are_refused_with_ironics_words(bad: dict[str, Any], words: str) -> None:
    with pytest.raises(errors.InvalidParameterValue) as refused:
        validate_rule(bad)
    assert words in refused.value.message


def test_a_valid_rule_passes_validation() -> None:
    validate_rule(
        rule(
            [{"op": "eq", "args": ["{inventory[cpu][count]}", 8]}],  # the deprecated list form
            [{"op": "set-capability", "args": {"name": "x", "value": "y"}}],
            priority=9999,
            description="big machines",
        )
    )
