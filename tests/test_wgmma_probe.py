"""The wgmma probe without a GPU: its params, B's shared-memory layout, and its SASS (one
native FP8 wgmma per 32 K, no spills)."""

from __future__ import annotations

from collections import Counter

import pytest

from mlpjit.kernels.wgmma_desc import CORE, core_matrix_descriptor, swizzled_descriptor
from mlpjit.kernels.wgmma_probe import ProbeParams, b_offset


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(k=48), r"k must be a multiple of 32 in \[32, 256\], got 48"),
        (dict(k=288), "k must be a multiple of 32"),
        (dict(k=64.0), "k must be a multiple of 32"),
        (dict(k=64, n=24), "n must be one of 8, 16, 32, got 24"),
        (dict(k=128, a_from="smem"), "a_from must be one of registers, tma, got 'smem'"),
        (dict(k=64, a_from="tma"), "k must be 128 with a_from='tma', got 64"),
    ],
)
def test_params_refuse_what_the_probe_cannot_take(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        ProbeParams(**change)


@pytest.mark.parametrize("n", [8, 32])
def test_b_layout_is_core_matrices_of_8_tokens_by_16_bytes(n: int) -> None:
    params = ProbeParams(96, n)
    gb = params.group_bytes
    offsets = {b_offset(t, kk, gb) for t in range(n) for kk in range(params.k)}
    assert offsets == set(range(params.smem_bytes))  # every byte once, no gaps
    assert b_offset(0, 16, gb) - b_offset(0, 0, gb) == CORE  # the step's second K half
    assert b_offset(1, 0, gb) - b_offset(0, 0, gb) == 16  # the next token: the next row
    assert b_offset(0, 32, gb) == 2 * CORE  # the next step
    assert b_offset(n - 1, 0, gb) == (n // 8 - 1) * gb + 7 * 16  # the last group's last row


def test_descriptor_fields() -> None:
    desc = core_matrix_descriptor(0x1A40, 1024)
    assert desc & 0x3FFF == 0x1A4  # start address / 16
    assert (desc >> 16) & 0x3FFF == CORE // 16  # leading offset: the step's second K half
    assert (desc >> 32) & 0x3FFF == 1024 // 16  # stride offset: the next 8 tokens
    assert desc >> 62 == 0  # no swizzle


@pytest.mark.parametrize(("k", "n"), [(32, 8), (256, 8), (128, 32)])
def test_probe_compiles_to_one_native_fp8_wgmma_per_step(k: int, n: int) -> None:
    pytest.importorskip("cutlass")
    from mlpjit.kernels.wgmma_probe import compile_cubin
    from mlpjit.testing.cubin_info import sass_facts

    facts = sass_facts(compile_cubin(ProbeParams(k, n), "sm_90a").cubin)
    count = Counter(facts.ops)
    assert facts.local == 0 and facts.stack == 0, "spills"
    assert count["QGMMA.64"] == k // 32
    assert facts.sass.count(f"QGMMA.64x{n}x32.F32.E4M3.E4M3 ") == k // 32
    assert count["WARPGROUP.ARRIVE"] == 1
    assert not any(op.startswith(("HMMA", "F2FP.F16.E4M3.UNPACK")) for op in count)


def test_a_descriptor_fields() -> None:
    desc = swizzled_descriptor(0x2000 + 32)  # an atom's start plus one 32-K step
    assert desc & 0x3FFF == (0x2000 + 32) >> 4
    assert (desc >> 32) & 0x3FFF == 1024 // 16  # stride offset: the next 8 rows' atom
    assert desc >> 62 == 1  # 128-byte swizzle


@pytest.mark.parametrize("n", [8, 32])
def test_tma_probe_copies_a_once_and_reads_it_by_descriptor(n: int) -> None:
    pytest.importorskip("cutlass")
    from mlpjit.kernels.wgmma_probe import compile_cubin
    from mlpjit.testing.cubin_info import sass_facts

    binary = compile_cubin(ProbeParams(128, n, "tma"), "sm_90a")
    facts = sass_facts(binary.cubin)
    assert facts.local == 0 and facts.stack == 0, "spills"
    assert facts.ops.count("UTMALDG.3D") == 1
    # A by descriptor: no A register operand between the accumulator and the descriptor
    assert facts.sass.count(f"QGMMA.64x{n}x32.F32.E4M3.E4M3 R24, gdesc[") == 4
    assert [p.name for p in binary.params] == ["out", "a", "b", "a_map"]
