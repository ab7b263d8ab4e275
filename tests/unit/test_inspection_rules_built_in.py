"""The conductor's built-in inspection rules file: read once at start, and a
file that cannot be used stops the start with the file and the rule named."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, load_settings
from services.common.inspection_rules.built_in import load_built_in_rules


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return str(path)


def test_rules_get_index_uuids_defaults_and_may_use_any_priority(tmp_path: Path) -> None:
    rules = load_built_in_rules(
        write(
            tmp_path,
            """
- priority: 20000
  actions: [{op: add-trait, args: {name: CUSTOM_A}}]
- uuid: 11111111-2222-3333-4444-555555555555
  conditions: [{op: is-true, args: {value: "{node.automated_clean}"}}]
  actions: [{op: log, args: {msg: hello}}]
""",
        )
    )
    assert [r["uuid"] for r in rules] == [
        "00000000-0000-0000-0000-000000000000",
        "11111111-2222-3333-4444-555555555555",
    ]
    assert [r["priority"] for r in rules] == [20000, 0]
    assert all(r["phase"] == "main" and r["built_in"] for r in rules)
    assert rules[0]["conditions"] == []


def test_no_file_and_an_empty_file_mean_no_rules(tmp_path: Path) -> None:
    assert load_built_in_rules("") == []
    assert load_built_in_rules(write(tmp_path, "")) == []


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{op: fail}", "must hold a list of rules"),
        ("- [unclosed", "is not valid YAML"),
        ("- actions: []", "rule 0: Validation failed for inspection rule: actions is required"),
        ("- actions: [{op: add-trait, args: {name: A}}]\n- actions: [{op: no-such-op}]", "rule 1: Unsupported action"),
        ("- phase: early\n  actions: [{op: log, args: {msg: x}}]", "rule 0: Invalid phase: early"),
    ],
)
def test_an_unusable_file_is_refused_naming_the_rule(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=words) as caught:
        load_built_in_rules(path)
    assert path in str(caught.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_built_in_rules(str(tmp_path / "absent.yaml"))


def test_the_masking_mode_is_checked_at_start() -> None:
    with pytest.raises(ConfigError, match="always, never or sensitive"):
        load_settings({}, overrides={"conductor": {"inspection_rules_mask_secrets": "sometimes"}})
    settings = load_settings({"FERRUM_CONDUCTOR_INSPECTION_RULES_MASK_SECRETS": "sensitive"})
    assert settings.conductor.inspection_rules_mask_secrets == "sensitive"
