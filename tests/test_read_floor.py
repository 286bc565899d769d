"""read_floor's params (the split of the stages over CTAs, the layout of each stage's
copies) and its compiled code (one bulk-copy site, the PDL wait only in the consumers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpjit.kernels.read_floor import ReadParams


def params(**overrides) -> ReadParams:
    values = dict(nbytes=3072 * 6144, row_bytes=6144, copy_bytes=2048, copies=16, stages=6)
    values.update(overrides)
    return ReadParams(**values)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"copy_bytes": 1000}, "copy_bytes"),
        ({"copy_bytes": 4096}, "copy_bytes"),  # does not divide a 6144-byte row
        ({"nbytes": 3072 * 6144 + 16}, "nbytes"),
        ({"stages": 8}, "stages"),  # 8 x 32 KB does not fit
        ({"stages": 0}, "stages"),
        ({"warps": 17}, "warps"),
        ({"copies": 33}, "copies"),
        ({"ctas": 2000}, "ctas"),  # more CTAs than stages to read (576)
        ({"stages": True}, "stages"),
        ({"barrier": True}, "then_nbytes"),  # a barrier needs a second phase
        ({"then_row_bytes": 1536}, "then_nbytes"),
        (
            {"then_nbytes": 6144 * 1536, "then_row_bytes": 1536, "then_copy_bytes": 1024},
            "then_copy_bytes",
        ),  # fmt: skip
        (
            {"then_nbytes": 100 * 16 * 1536, "then_row_bytes": 1536, "then_copy_bytes": 1536},
            "ctas",
        ),  # 100 stages for 132 CTAs  # fmt: skip
        (
            {
                "then_nbytes": 6144 * 1536,
                "then_row_bytes": 1536,
                "then_copy_bytes": 1536,
                "barrier": 1,
            },
            "barrier",
        ),  # fmt: skip
        ({"tensor": 1}, "tensor"),
        ({"dynamic": -1}, "dynamic"),
        ({"dynamic": True}, "dynamic"),
        ({"dynamic": 2, "copy_bytes": 128, "stages": 49}, "dynamic"),  # slot words: 48 at most
        (
            {
                "dynamic": 2,
                "then_nbytes": 6144 * 1536,
                "then_row_bytes": 1536,
                "then_copy_bytes": 1536,
            },
            "dynamic",
        ),  # fmt: skip
        ({"tensor": True, "copies": 4}, "tensor"),  # not whole 1 KB swizzle atoms
        (
            {
                "tensor": True,
                "then_nbytes": 6144 * 1536,
                "then_row_bytes": 1536,
                "then_copy_bytes": 1536,
            },
            "tensor",
        ),  # fmt: skip
    ],
)
def test_bad_params_name_the_argument(overrides, named) -> None:
    with pytest.raises(ValueError, match=f"read_floor param {named}"):
        params(**overrides)


def test_a_second_phase_follows_the_first() -> None:
    p = params(then_nbytes=6144 * 1536, then_row_bytes=1536, then_copy_bytes=1536)
    assert p.total_bytes == 3072 * 6144 + 6144 * 1536
    assert p.stage_bytes == 16 * 2048  # the larger phase's stage
    assert p.unit_offset(0, phase=1) == 3072 * 6144
    assert p.unit_offset(1, phase=1) == 3072 * 6144 + 16 * 1536  # one 1536-byte row a stage
    assert p.cta_units(131, phase=1) == (381, 384)
    assert p.out_words == 132 * 8 * 32 + 1


@settings(max_examples=200, deadline=None)
@given(
    tiles=st.integers(1, 400),
    chunks=st.integers(1, 8),
    copy=st.sampled_from([128, 512, 2048]),
    copies=st.sampled_from([1, 2, 16]),
    ctas=st.integers(1, 264),
)
def test_every_byte_is_read_once(tiles, chunks, copy, copies, ctas) -> None:
    """The CTAs' stage ranges cover every stage once, and the stages' copies cover every
    byte once: what the GPU test's XOR checks on the device."""
    row = chunks * copy
    units = tiles * chunks
    if ctas > units:
        ctas = units
    p = ReadParams(
        nbytes=tiles * copies * row, row_bytes=row, copy_bytes=copy, copies=copies,
        stages=1, ctas=ctas,
    )  # fmt: skip
    ranges = [p.cta_units(c) for c in range(ctas)]
    assert ranges[0][0] == 0 and ranges[-1][1] == units
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
    starts = sorted(p.unit_offset(u) + j * row for u in range(units) for j in range(copies))
    assert starts == list(range(0, p.nbytes, copy))


@settings(max_examples=200, deadline=None)
@given(
    units=st.integers(1, 600),
    ctas=st.integers(1, 200),
    fixed=st.integers(1, 8),
    launches=st.integers(1, 4),
    data=st.data(),
)
def test_claims_read_every_stage_once_in_every_launch(units, ctas, fixed, launches, data):
    """dynamic: whatever order the CTAs' claims reach the counter in, each launch reads
    every stage once (a fixed range, then claims) and ends with one refused claim per CTA,
    so the next launch's claims start at a multiple of dynamic_claims: no reset needed."""
    ctas = min(ctas, units)
    p = ReadParams(nbytes=units * 2048, row_bytes=2048, copy_bytes=2048, copies=1,
                   stages=2, ctas=ctas, dynamic=fixed)  # fmt: skip
    counter = 0
    for _ in range(launches):
        read = [u for c in range(ctas) for u in range(*p.cta_units(c))]
        claiming = list(range(ctas))  # CTAs whose last claim was not refused
        while claiming:
            cta = data.draw(st.sampled_from(claiming))
            stage = p.claimed_stage(counter)
            counter += 1
            if stage is None:
                claiming.remove(cta)
            else:
                read.append(stage)
        assert sorted(read) == list(range(units))
        assert counter % p.dynamic_claims == 0
    assert p.out_words == p.thread_words + 4 and p.thread_words % 2 == 0


def test_compiled_kernel_streams_before_the_wait() -> None:
    """One bulk-copy site in the producer, no spills, and the PDL wait (ACQBULK) comes
    after the producer's branch: the copies never wait for the previous kernel."""
    from mlpjit.kernels.read_floor import compile_cubin
    from mlpjit.testing.cubin_info import sass_facts

    binary = compile_cubin(params(), "sm_90a")
    facts = sass_facts(binary.cubin)
    assert facts.stack == 0 and facts.local == 0
    assert facts.ops.count("UBLKCP.S.G") == 1
    assert facts.ops.index("UBLKCP.S.G") < facts.ops.index("ACQBULK")
    assert binary.smem_bytes == 1024 + 6 * 16 * 2048
    assert binary.block == (32 * 9, 1, 1) and binary.pdl
    assert "ATOMG.E.ADD.STRONG.GPU" not in facts.ops


def test_compiled_one_kernel_layer_meets_at_one_barrier() -> None:
    """Two phases: a bulk-copy site each, one arrival atomic (the grid-wide barrier), and
    the producer's copies still before the wait."""
    from mlpjit.kernels.read_floor import compile_cubin
    from mlpjit.testing.cubin_info import sass_facts

    layer = params(then_nbytes=6144 * 1536, then_row_bytes=1536, then_copy_bytes=1536)
    for barrier, atomics in ((True, 1), (False, 0)):
        facts = sass_facts(compile_cubin(ReadParams(**{**vars(layer), "barrier": barrier}),
                                         "sm_90a").cubin)  # fmt: skip
        assert facts.stack == 0 and facts.local == 0
        assert facts.ops.count("UBLKCP.S.G") == 2
        assert facts.ops.count("ATOMG.E.ADD.STRONG.GPU") == atomics
        assert max(i for i, op in enumerate(facts.ops) if op == "UBLKCP.S.G") < facts.ops.index(
            "ACQBULK"
        )


def test_compiled_tensor_stages_are_one_tma_copy_each() -> None:
    """tensor: one 3-D TMA copy site (one lane) instead of row copies, still before the
    wait, and a third pointer parameter (the tensor map)."""
    from mlpjit.kernels.read_floor import compile_cubin
    from mlpjit.testing.cubin_info import cubin_kernel_params, sass_facts

    binary = compile_cubin(params(tensor=True), "sm_90a")
    facts = sass_facts(binary.cubin)
    assert facts.stack == 0 and facts.local == 0
    assert facts.ops.count("UTMALDG.3D") == 1 and "UBLKCP.S.G" not in facts.ops
    assert facts.ops.index("UTMALDG.3D") < facts.ops.index("ACQBULK")
    assert [p.name for p in binary.params] == ["out", "buf", "map"]
    assert [p.size for p in cubin_kernel_params(binary.cubin, binary.symbol)] == [8, 8, 8]


def test_compiled_dynamic_kernel_claims_after_the_wait() -> None:
    """dynamic: the fixed range's copies come before any PDL wait, the claims (64-bit
    atomics) after the producer's own wait, and a second bulk-copy site for the claimed
    stages; nothing spills."""
    from mlpjit.kernels.read_floor import compile_cubin
    from mlpjit.testing.cubin_info import sass_facts

    facts = sass_facts(compile_cubin(params(dynamic=2), "sm_90a").cubin)
    assert facts.stack == 0 and facts.local == 0
    copies = [i for i, op in enumerate(facts.ops) if op == "UBLKCP.S.G"]
    waits = [i for i, op in enumerate(facts.ops) if op == "ACQBULK"]
    atomics = [i for i, op in enumerate(facts.ops) if op == "ATOMG.E.ADD.64.STRONG.GPU"]
    assert len(copies) == 2 and len(waits) == 2 and atomics
    assert copies[0] < waits[0] < min(atomics)
