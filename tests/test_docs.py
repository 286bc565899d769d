"""The README documents every MLPJIT_* variable the package reads, and nothing stale."""

from __future__ import annotations

import re
from pathlib import Path

from mlpjit.jit.config import ENV_VARS

ROOT = Path(__file__).resolve().parent.parent


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"\bMLPJIT_[A-Z_]+[A-Z]\b", text))


def test_every_env_var_in_the_code_is_registered_and_documented():
    used = set()
    for path in (ROOT / "mlpjit").rglob("*.py"):
        used |= _names_in(path.read_text())
    readme = _names_in((ROOT / "README.md").read_text())
    assert used <= set(ENV_VARS), (
        f"read but not registered in config.ENV_VARS: {used - set(ENV_VARS)}"
    )
    assert set(ENV_VARS) <= readme, f"not documented in README: {set(ENV_VARS) - readme}"
    assert readme <= set(ENV_VARS), f"README documents unknown variables: {readme - set(ENV_VARS)}"


def test_the_readme_env_table_is_config_env_vars():
    """The README's table rows are ENV_VARS' name, default and doc, in order."""
    rows = re.findall(r"^\| `(MLPJIT_[A-Z_]+)` \| (.*?) \| (.*) \|$", _readme(), re.M)
    assert rows == [(v.name, v.default, v.doc) for v in ENV_VARS.values()]


def _readme() -> str:
    return (ROOT / "README.md").read_text()
