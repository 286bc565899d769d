"""The architecture the folders promise: the JIT library knows no kernel, kernels plan
without a compiler, `import mlpjit` stays cheap, and scripts/ holds entry points only."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _imported_after(code: str) -> list[str]:
    """Module names in sys.modules after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_the_jit_library_imports_no_kernel():
    jit = REPO / "mlpjit" / "jit"
    modules = sorted(
        ".".join(p.relative_to(jit).with_suffix("").parts).removesuffix(".__init__")
        for p in jit.rglob("*.py")
        if p != jit / "__init__.py"
    )
    assert {"key", "manager", "spec", "store", "launcher", "remote.client"} <= set(modules)
    code = "\n".join(f"import mlpjit.jit.{name}" for name in modules)
    loaded = _imported_after(code)
    assert [m for m in loaded if m.startswith("mlpjit.kernels")] == []
    assert [m for m in loaded if m.startswith("mlpjit.testing")] == []
    assert "cutlass" not in loaded


def test_kernel_packages_register_and_plan_without_a_compiler():
    loaded = _imported_after(
        "import mlpjit.kernels\n"
        "from mlpjit.jit.spec import registered_names\n"
        "from mlpjit.layer_plan import dense_mlp_requests\n"
        "assert 'fp8_gemv' in registered_names()\n"
        "dense_mlp_requests(6144, 12288, 8, range(1, 9), 'sm_90a')"
    )
    assert "cutlass" not in loaded and "torch" not in loaded
    assert "mlpjit.kernels.fp8_gemv.kernel" not in loaded  # the CuTe DSL module: a miss only


def test_kernel_packages_know_no_layer_planner():
    """The layer planner asks the kernel packages, never the other way round: its rules stay
    out of every kernel's package source, so out of every kernel's cache key."""
    planners = ("fp8_gemv.plan", "fp8_stream.plan", "fp8_layer.plan")
    loaded = _imported_after("\n".join(f"import mlpjit.kernels.{name}" for name in planners))
    assert "mlpjit.layer_plan" not in loaded
    kernels = REPO / "mlpjit" / "kernels"
    assert [p for p in kernels.rglob("*.py") if "import layer_plan" in p.read_text()] == []
    assert [p for p in kernels.rglob("*.py") if "from mlpjit.layer_plan" in p.read_text()] == []


def test_import_mlpjit_is_cheap():
    loaded = _imported_after("import mlpjit")
    heavy = [m for m in loaded if m.split(".")[0] in ("cutlass", "cuda", "torch", "filelock")]
    assert heavy == []
    assert [m for m in loaded if m.startswith("mlpjit.")] == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str | None) -> bool:
    return (module or "").split(".")[0] == "mlpjit"


def _foreign_names(tree: ast.AST) -> set[str]:
    """Names a module binds to other packages' modules and objects (torch, filelock, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound = [(a.name, (a.asname or a.name).split(".")[0]) for a in node.names]
            names |= {name for module, name in bound if not _ours(module)}
        elif isinstance(node, ast.ImportFrom) and not (node.level or _ours(node.module)):
            names |= {a.asname or a.name for a in node.names}
    return names


# Private attributes of other packages' objects that mlpjit sets on purpose: transformers
# reads a model config's _experts_implementation (the tiny test models pick the eager one).
FOREIGN_PRIVATE = {"_experts_implementation"}


def test_no_module_uses_another_modules_private_names():
    """A module of mlpjit reaches another one only through its public names: no
    ``from m import _name``, and no ``obj._name`` on anything but ``self``, ``cls`` or
    another package's module (torch._C is torch's business)."""
    package = REPO / "mlpjit"
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(REPO)
        tree = ast.parse(path.read_text(), str(path))
        allowed = {"self", "cls"} | _foreign_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or _ours(node.module)):
                found += [
                    f"{where}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if _private(a.name)
                ]
            elif (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and node.attr not in FOREIGN_PRIVATE
            ):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if owner not in allowed:
                    found.append(f"{where}:{node.lineno} uses .{node.attr}")
    assert found == []


# Ways of importing a file by its path (importlib, runpy, the old conftest helper).
PATH_LOADERS = {"spec_from_file_location", "SourceFileLoader", "run_path", "load_script"}


def _script_uses(path: Path, scripts: set[str]) -> list[str]:
    """Where the file at ``path`` imports a script by name; in a test, any import of a file
    by its path; in a script, a string naming scripts/ or a script's file."""
    where = path.relative_to(REPO)
    is_test = where.parts[0] == "tests"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""]
        found += [
            f"{where}:{node.lineno} imports {m}" for m in modules if m.split(".")[0] in scripts
        ]
        name = getattr(node, "id", None) or getattr(node, "attr", None)
        if is_test and name in PATH_LOADERS:
            found.append(f"{where}:{node.lineno} imports a file by path ({name})")
        text = getattr(node, "value", None) if isinstance(node, ast.Constant) else None
        if (
            not is_test
            and isinstance(text, str)
            and text.removesuffix(".py") in {*scripts, "scripts"}
        ):
            found.append(f"{where}:{node.lineno} names a script ({text!r})")
    return found


def test_scripts_are_entry_points_only():
    """Nothing imports a script: what a test or another script needs of one lives in the
    package (mlpjit.bench, mlpjit.testing) and is imported from there. A test may still run a
    script's command line in a subprocess (tests/test_bench_tp_demo.py); a test imports no
    file by its path, and a script names no script's file."""
    scripts = {p.stem for p in (REPO / "scripts").glob("*.py")}
    assert {"bench_dense_mlp", "bench_startup", "tune_fp8_stream"} <= scripts
    files = sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "scripts").glob("*.py")])
    assert [line for path in files for line in _script_uses(path, scripts)] == []
