"""read_floor on the GPU: every byte of the buffer read once (the XOR of the words the
consumer threads read equals the buffer's), in row and contiguous stages, rings that wrap
many times, CTA counts that do not divide the stages, four consumer warps, two phases with
and without the grid-wide barrier, stages of one TMA tensor copy (the XOR does not see the
swizzle), stages claimed from a counter (dynamic; the counter after the two rounds is two
launches' claims), in PDL chains launched twice."""

from __future__ import annotations

import pytest
import torch

from mlpjit.bench.read_floor import xor_words

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CASES = {
    "rows": dict(nbytes=3072 * 6144, row_bytes=6144, copy_bytes=2048, copies=16, stages=6),
    "short_rows": dict(
        nbytes=6144 * 1536, row_bytes=1536, copy_bytes=1536, copies=16, stages=2
    ),  # fmt: skip
    "contiguous": dict(
        nbytes=7 * 1 << 20, row_bytes=32768, copy_bytes=32768, copies=1, stages=3, ctas=131
    ),  # fmt: skip
    "layer_with_barrier": dict(
        nbytes=3072 * 6144,
        row_bytes=6144,
        copy_bytes=2048,
        copies=16,
        stages=6,
        then_nbytes=6144 * 1536,
        then_row_bytes=1536,
        then_copy_bytes=1536,
        barrier=True,
    ),  # fmt: skip
    "layer_flat": dict(
        nbytes=512 * 7168,
        row_bytes=32768,
        copy_bytes=32768,
        copies=1,
        stages=5,
        then_nbytes=56 * 32768,
        then_row_bytes=32768,
        then_copy_bytes=32768,
        ctas=56,
    ),  # fmt: skip
    "few_warps": dict(
        nbytes=512 * 2048, row_bytes=2048, copy_bytes=1024, copies=8, stages=3, warps=4, ctas=127
    ),  # fmt: skip
    "tensor_rows": dict(
        nbytes=3072 * 6144, row_bytes=6144, copy_bytes=2048, copies=16, stages=6, tensor=True
    ),  # fmt: skip
    "tensor_short_rows": dict(
        nbytes=7168 * 256,
        row_bytes=256,
        copy_bytes=256,
        copies=8,
        stages=3,
        ctas=131,
        tensor=True,
    ),  # fmt: skip
    "dynamic_rows": dict(
        nbytes=3072 * 6144, row_bytes=6144, copy_bytes=2048, copies=16, stages=6, dynamic=2
    ),  # fmt: skip
    "dynamic_contiguous": dict(
        nbytes=7 * 1 << 20,
        row_bytes=32768,
        copy_bytes=32768,
        copies=1,
        stages=3,
        ctas=131,
        dynamic=1,
    ),  # fmt: skip
    "dynamic_all_fixed": dict(
        nbytes=6144 * 1536, row_bytes=1536, copy_bytes=1536, copies=16, stages=2, dynamic=8
    ),  # fmt: skip (384 stages, 8 per CTA: every claim is refused)
}


def kernel_requests(arch: str = "sm_90a") -> list:
    """The compile requests these tests use (for warming a cache without a GPU)."""
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.kernels.read_floor import ReadParams

    return [KernelRequest("read_floor", vars(ReadParams(**c)).copy(), arch) for c in CASES.values()]


def load(case: str):
    """The case's params and its kernel, from the cache."""
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.kernels.read_floor import ReadParams

    params = ReadParams(**CASES[case])
    entry = default_manager().get(KernelRequest("read_floor", vars(params).copy(), "sm_90a"))
    return params, load_kernel(entry, torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.parametrize("case", list(CASES))
def test_every_byte_is_read_once(case) -> None:
    params, kernel = load(case)
    gen = torch.Generator(device="cuda").manual_seed(len(case))
    bufs = [torch.randint(0, 256, (params.total_bytes,), dtype=torch.uint8, device="cuda",
                          generator=gen) for _ in range(3)]  # fmt: skip
    outs = [torch.full((params.out_words,), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
            for _ in bufs]  # fmt: skip
    for out in outs:
        out[params.thread_words :] = 0  # the barrier's arrival count (and the claim counter)
    maps = [()] * len(bufs)
    if params.tensor:
        from mlpjit.kernels.tensor_map import weight_block_map

        box = (params.copies, params.copy_bytes // 128)
        maps = [(weight_block_map(b.view(-1, params.row_bytes), *box),) for b in bufs]
    for _ in range(2):  # the count only grows: a second round meets at the next multiple
        for out, buf, tmap in zip(outs, bufs, maps, strict=True):  # a PDL chain of three
            kernel.launch((out, buf, *tmap))
    torch.cuda.synchronize()
    for out, buf in zip(outs, bufs, strict=True):
        assert xor_words(out[: params.thread_words].view(torch.uint8)) == xor_words(buf)
        assert int(out[params.thread_words]) == (2 * params.ctas if params.barrier else 0)
        if params.dynamic:
            claims = out[params.thread_words + 2 :].view(torch.int64)
            assert int(claims[0]) == 2 * params.dynamic_claims
