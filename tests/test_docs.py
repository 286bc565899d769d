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
