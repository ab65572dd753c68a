"""The CI tier and the slow tier of a sweep (CONTRIBUTING.md, "Test tiers")."""
import pytest


def sweep(values, ci) -> list:
    """`values` as pytest parameters, each one not in `ci` marked slow: a sweep over families,
    cells or notebooks keeps its cheapest members in the CI tier and runs in full under
    `pytest -m slow`. A tuple value is one test's several arguments."""
    def param(value):
        args = value if isinstance(value, tuple) else (value,)
        return pytest.param(*args, marks=() if value in ci else pytest.mark.slow)
    return [param(v) for v in values]
