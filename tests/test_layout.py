"""The architecture the folders promise: the JIT library knows no kernel, kernels plan
without a compiler, and `import mlpjit` stays cheap."""

from __future__ import annotations

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
        "from mlpjit.kernels.fp8_gemv.plan import dense_mlp_requests\n"
        "assert 'fp8_gemv' in registered_names()\n"
        "dense_mlp_requests(6144, 12288, 8, range(1, 9), 'sm_90a')"
    )
    assert "cutlass" not in loaded and "torch" not in loaded
    assert "mlpjit.kernels.fp8_gemv.kernel" not in loaded  # the CuTe DSL module: a miss only


def test_import_mlpjit_is_cheap():
    loaded = _imported_after("import mlpjit")
    heavy = [m for m in loaded if m.split(".")[0] in ("cutlass", "cuda", "torch", "filelock")]
    assert heavy == []
    assert [m for m in loaded if m.startswith("mlpjit.")] == []
