"""Ironic's inspection rules (API 1.96): conditions on a node's inventory and
actions on the node, evaluated when an inspection's inventory arrives.

One definition for the api (which validates rules when they are created or
patched) and the conductor (which runs them):

- operations.py: every condition operator and action, with its arguments;
- validation.py: ``validate_rule`` (the rule document, Ironic's messages);
- interpolation.py: ``{inventory[cpu][count]}``-style values;
- engine.py: ``apply_rules`` over a ``RuleTarget`` (the node being inspected).

The format is Ironic's, described in its api-ref and reproduced in
docs/cleaning.md ("Inspection rules").
"""

from services.common.inspection_rules.engine import InspectionRuleFailure, RuleTarget, apply_rules
from services.common.inspection_rules.validation import validate_rule

__all__ = ["InspectionRuleFailure", "RuleTarget", "apply_rules", "validate_rule"]
