"""CuTe DSL program -> cubin bytes and kernel symbol, the last step of every kernel's
compile_cubin (imports cutlass: call it only from a builder module, i.e. on a miss)."""

from __future__ import annotations

import shlex
import tempfile
from typing import Any

from mlpjit.jit.scratch import scratch_prefix

__all__ = ["compile_to_cubin"]


def compile_to_cubin(program: Any, *args: Any, arch: str) -> tuple[bytes, str]:
    """``cute.compile(program, *args)`` for ``arch`` (e.g. "sm_90a", no GPU needed); returns
    the cubin and the one kernel's symbol. RuntimeError if CuTe DSL returned no cubin or not
    exactly one kernel.

    ``--keep-cubin`` also writes the cubin into a dump dir (default: the caller's cwd): it
    goes to a private scratch dir named by this pid, which `mlpjit cache clear` removes if
    the compile is killed.
    """
    import cutlass.cute as cute

    with tempfile.TemporaryDirectory(prefix=scratch_prefix("cute")) as dump:
        options = f"--gpu-arch {shlex.quote(arch)} --keep-cubin --dump-dir {shlex.quote(dump)}"
        compiled = cute.compile(program, *args, options=options)
        cubin = compiled.artifacts.CUBIN
    symbols = list(compiled.kernel_info)
    if not isinstance(cubin, (bytes, bytearray)) or len(symbols) != 1:
        raise RuntimeError(
            f"CuTe DSL returned no cubin or not exactly one kernel (symbols: {symbols})"
        )
    return bytes(cubin), symbols[0]
