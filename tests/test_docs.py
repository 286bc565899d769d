"""The README documents every MLPJIT_* variable the package reads, and nothing stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_the_readme_route_without_a_gpu_runs_as_written(capsys):
    """The README's way to try the transformers integration on a CPU machine (a tiny FP8
    model built in memory, apply(), generate()) runs as printed and routes what it says."""
    pytest.importorskip("transformers")
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    [snippet] = [block for block in blocks if "tiny_models" in block]
    exec(compile(snippet, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    claimed = re.search(r"print\(mlpjit_tf\.apply\(model\)\)  # \[(.*), \.\.\.\]", snippet)
    assert claimed is not None
    assert printed[0].startswith("[" + claimed.group(1))
    # generate() printed the prompt and up to 4 new tokens (the untrained model's vary)
    assert printed[1].startswith("tensor([[")
    tokens = [int(t) for t in re.findall(r"\d+", printed[1])]
    assert tokens[:3] == [3, 14, 15] and 3 < len(tokens) <= 3 + 4


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_are_written_for_users():
    """No words about how the work was organised (sessions, drafts, issue or stop numbers)."""
    process = re.compile(r"\bsessions?\b|\bdraft\b|\bissue #?\d+|\bstop \d+", re.I)
    for path in DOCS:
        found = [m.group(0) for m in process.finditer(path.read_text())]
        assert not found, (path.name, found)


def test_every_plot_is_shown_and_says_how_it_was_drawn():
    """Each PNG in docs/ is in a doc, and a command next to it draws it (--plot docs/X)."""
    text = "\n".join(path.read_text() for path in DOCS)
    shown = set(re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text))
    assert shown == {path.name for path in (ROOT / "docs").glob("*.png")}
    for name in shown:
        assert f"--plot docs/{name}" in text, name


def test_the_readme_says_how_to_get_a_cpu_build_of_torch():
    """The quick start's torch pin is CI's, and the README names the CPU wheel index for it
    (on PyPI the pin is the CUDA build)."""
    pin = re.search(r"pip install -q (torch==\S+) -e \.", _readme())
    assert pin is not None
    assert f"pip install -q {pin.group(1)} -e" in (ROOT / ".ci" / "run").read_text()
    cpu = f"pip install -q {pin.group(1)} --index-url https://download.pytorch.org/whl/cpu"
    assert cpu in _readme()
