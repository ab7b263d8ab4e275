"""Built-in inspection rules: a YAML list an operator ships with the
conductor (Ironic's ``[inspection_rules]built_in_rules``). They run with the
stored rules but are not stored and not shown by the API, so a site can keep
rules that tenants of the API must not see or change. They may use any
priority (a stored rule is limited to 0–9999). A rule without a uuid gets
``00000000-0000-0000-0000-<index>``, as Ironic names them.

The file is read once when the conductor starts; a rule that does not
validate stops the start with the file and the rule's index named."""

from __future__ import annotations

from typing import Any

import yaml

from services.common import errors
from services.common.config import ConfigError
from services.common.inspection_rules.validation import validate_rule


def load_built_in_rules(path: str) -> list[dict[str, Any]]:
    """The validated rules of ``path``; ``[]`` when ``path`` is empty."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"inspection rules file {path} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"inspection rules file {path} is not valid YAML: {exc}") from None
    if document is None:
        return []
    if not isinstance(document, list):
        raise ConfigError(f"inspection rules file {path} must hold a list of rules")
    rules = []
    for index, rule in enumerate(document):
        try:
            validate_rule(rule, built_in=True)
        except errors.InvalidParameterValue as exc:
            raise ConfigError(f"inspection rules file {path}, rule {index}: {exc.message}") from None
        rules.append(
            {
                **rule,
                "uuid": rule.get("uuid") or f"00000000-0000-0000-0000-{index:012x}",
                "phase": rule.get("phase") or "main",
                "priority": rule.get("priority") or 0,
                "conditions": rule.get("conditions") or [],
                "built_in": True,
            }
        )
    return rules
