"""CuTe DSL program -> cubin bytes and kernel symbol, the last step of every kernel's
compile_cubin (imports cutlass: call it only from a builder module, i.e. on a miss)."""

from __future__ import annotations

import shlex
import tempfile
from typing import Any

from mlpjit.jit.scratch import scratch_prefix

__all__ = ["compile_to_cubin", "launch_options", "row_major_tensor"]


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


def launch_options(
    ctas: int,
    threads: int,
    smem_bytes: int,
    ctas_per_sm: int | None = None,
    cluster_ctas: int = 1,
) -> dict[str, Any]:
    """The keyword arguments of a kernel's ``launch``: a one-dimensional grid with PDL on,
    ``ctas_per_sm`` as the launch bound (none if None) and clusters of ``cluster_ctas``."""
    options: dict[str, Any] = dict(
        grid=[ctas, 1, 1], block=[threads, 1, 1], smem=smem_bytes, use_pdl=True
    )
    if ctas_per_sm is not None:
        options["min_blocks_per_mp"] = ctas_per_sm
        if ctas_per_sm > 1:
            # Without an explicit carveout the DSL queries the device for min_blocks > 1.
            options["preferred_smem_carveout"] = 100
    if cluster_ctas > 1:
        options["cluster"] = [cluster_ctas, 1, 1]
    return options


def row_major_tensor(dtype: Any, shape: tuple[int, ...]) -> Any:
    """A fake (shape-only) compact row-major tensor of 16-byte aligned data: what a kernel
    is compiled against, so its parameters become plain pointers."""
    import cutlass.cute as cute

    order = tuple(range(len(shape) - 1, -1, -1))
    return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)
