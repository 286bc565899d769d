"""CPU checks of the fp8_layer kernel: it compiles for sm_90a without a GPU, and its SASS
has what kernel.py's docstring promises (both phases' bulk copies counted on mbarriers, FP8
mma, one PDL trigger, the act counter's release adds and acquire spin, no spills) and its
parameters match the launcher's list."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

pytest.importorskip("cutlass")

from mlpjit.kernels import hopper  # noqa: E402
from mlpjit.kernels.fp8_layer import plan  # noqa: E402
from mlpjit.kernels.fp8_layer.params import KERNEL_ARGS  # noqa: E402
from mlpjit.testing.cubin_info import cubin_kernel_params, sass_facts  # noqa: E402

ARCH = "sm_90a"
# (hidden, inter, tokens, ue8m0, limit): the DeepSeek-V3 TP-8 shared expert, GLM-5 TP 8 with
# a clamp at 8 tokens.
CASES = [(7168, 256, 1, True, None), (6144, 1536, 8, False, 3.0)]


@functools.cache
def _facts(case: tuple) -> dict:
    from mlpjit.kernels.fp8_layer.kernel import compile_cubin

    hidden, inter, tokens, ue8m0, limit = case
    params = plan.layer_params(hidden, inter, tokens, limit=limit, ue8m0=ue8m0)
    binary = compile_cubin(params, ARCH)
    f = sass_facts(binary.cubin)
    return dict(
        params=params, binary=binary, regs=f.regs, stack=f.stack, local=f.local,
        count=Counter(f.ops), cubin_params=cubin_kernel_params(binary.cubin, binary.symbol),
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}-t{c[2]}" for c in CASES])
def test_layer_kernel_sass(case) -> None:
    f = _facts(case)
    params, binary, count = f["params"], f["binary"], f["count"]
    assert f["stack"] == 0 and f["local"] == 0, "spills"
    assert f["regs"] * binary.block[0] <= hopper.REGS_PER_SM
    assert binary.grid == (hopper.SMS, 1, 1) and binary.block == (params.threads, 1, 1)
    assert binary.smem_bytes == params.smem_bytes <= hopper.smem_budget(1)
    assert binary.pdl is True
    # Both phases' rings: bulk copies counted on mbarriers (two producer loops).
    assert count["UBLKCP.S.G"] >= 2
    # Both phases' mmas: each block 4 m16n8k32 e4m3 = 8 HMMA.16816.F32.
    assert count["HMMA.16816.F32"] == 2 * 8 * params.blocks_per_warp
    # One PDL trigger (gate_up's consumers); down waits for act, not for a kernel.
    assert count["PREEXIT"] == 1
    # act: release adds by the epilogue warp, an acquire spin, and the reset.
    assert count["REDG.E.ADD.STRONG.GPU"] >= 1
    assert any(op.startswith("LDG.E.STRONG.GPU") for op in count)
    assert [p.name for p in binary.params] == list(KERNEL_ARGS)
    assert [p.size for p in f["cubin_params"]] == [8] * len(KERNEL_ARGS)
