"""Read a kernel's parameter layout out of a cubin with `cuobjdump -elf`.

The manifest records each kernel's parameter list (name, kind); the launcher packs arguments
from it. If the manifest and the cubin disagree, a launch passes garbage pointers, so tests
(and operators) check manifests against the cubin's own EIATTR_KPARAM_INFO records, which
give each parameter's ordinal, offset and size in the parameter buffer. Tooling only: the
hit path never runs cuobjdump.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlpjit.errors import MlpjitError

if TYPE_CHECKING:
    from mlpjit.jit.binary import KernelBinary

__all__ = [
    "CubinParam",
    "SassFacts",
    "cubin_kernel_params",
    "find_cuobjdump",
    "param_mismatches",
    "sass_facts",
]

_SIZES = {"ptr": 8, "i32": 4, "f32": 4}
_KPARAM = re.compile(
    r"Ordinal\s*:\s*(0x[0-9a-fA-F]+)\s+Offset\s*:\s*(0x[0-9a-fA-F]+)\s+Size\s*:\s*(0x[0-9a-fA-F]+)"
)


@dataclass(frozen=True)
class CubinParam:
    """One kernel parameter as the cubin records it."""

    ordinal: int
    offset: int  # bytes into the parameter buffer
    size: int  # bytes


def find_cuobjdump() -> str:
    """Path of cuobjdump: from the nvidia-cuda-cuobjdump wheel first, then PATH.

    Raises MlpjitError naming the package to install when neither has it.
    """
    try:
        import nvidia

        roots = [Path(p) for p in nvidia.__path__]
    except ImportError:
        roots = []
    for root in roots:
        for candidate in sorted(root.glob("*/bin/cuobjdump")) + sorted(root.glob("bin/cuobjdump")):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    found = shutil.which("cuobjdump")
    if found:
        return found
    raise MlpjitError(
        "cuobjdump not found: install the test extra (pip install 'mlpjit[test]', which "
        "brings nvidia-cuda-cuobjdump) or put the CUDA toolkit's bin on PATH"
    )


def _nv_info_section(listing: str, symbol: str) -> str:
    """The text of the `.nv.info.<symbol>` section of a `cuobjdump -elf` listing."""
    header = f".nv.info.{symbol}"
    lines = listing.splitlines()
    for start, line in enumerate(lines):
        if line.strip() == header and not line[:1].isspace():
            body = []
            for following in lines[start + 1 :]:
                if following and not following[:1].isspace():
                    break  # next section header
                body.append(following)
            return "\n".join(body)
    raise MlpjitError(f"kernel {symbol!r} has no {header} section in the cubin")


def cubin_kernel_params(cubin: bytes, symbol: str) -> list[CubinParam]:
    """Parameters of kernel `symbol` in `cubin`, sorted by ordinal (via `cuobjdump -elf`)."""
    tool = find_cuobjdump()
    with tempfile.TemporaryDirectory(prefix="mlpjit-cubin-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        run = subprocess.run([tool, "-elf", str(path)], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise MlpjitError(f"cuobjdump -elf failed ({run.returncode}): {run.stderr.strip()}")
    section = _nv_info_section(run.stdout, symbol)
    params = {
        int(o, 16): CubinParam(int(o, 16), int(off, 16), int(size, 16))
        for o, off, size in _KPARAM.findall(section)
    }
    return [params[o] for o in sorted(params)]


def param_mismatches(binary: KernelBinary) -> list[str]:
    """Differences between a binary's declared params and its cubin's; empty when they agree."""
    found = cubin_kernel_params(binary.cubin, binary.symbol)
    problems = []
    if len(found) != len(binary.params):
        problems.append(
            f"{binary.symbol}: manifest lists {len(binary.params)} parameters, "
            f"cubin has {len(found)}"
        )
    for declared, actual in zip(binary.params, found, strict=False):
        want = _SIZES.get(declared.kind)
        if want != actual.size:
            problems.append(
                f"{binary.symbol}: parameter {actual.ordinal} {declared.name!r} is "
                f"{declared.kind} ({want} bytes) but {actual.size} bytes in the cubin"
            )
    return problems


_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_SASS_OP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


@dataclass(frozen=True)
class SassFacts:
    """What the compile tests read from one cubin: resource usage and the SASS opcodes."""

    regs: int
    stack: int
    static_smem: int
    local: int
    ops: tuple[str, ...]  # opcodes with modifiers, in program order (predicates dropped)
    sass: str  # the whole `cuobjdump -sass` text


def sass_facts(cubin: bytes) -> SassFacts:
    """Resource usage (`cuobjdump -res-usage`) and SASS opcodes (`-sass`) of a one-kernel
    cubin; MlpjitError if cuobjdump fails."""
    tool = find_cuobjdump()
    with tempfile.TemporaryDirectory(prefix="mlpjit-cubin-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        res = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True)
        sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    match = _RES.search(res.stdout)
    if res.returncode != 0 or sass.returncode != 0 or match is None:
        raise MlpjitError(f"cuobjdump failed: {(res.stderr + sass.stderr).strip()[:200]}")
    regs, stack, static_smem, local = (int(v) for v in match.groups())
    ops = tuple(m.group(1) for line in sass.stdout.splitlines() if (m := _SASS_OP.match(line)))
    return SassFacts(regs, stack, static_smem, local, ops, sass.stdout)
