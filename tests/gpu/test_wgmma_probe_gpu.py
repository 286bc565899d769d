"""The wgmma probe on the GPU: wgmma.m64nNk32.e4m3 with A in mma.sync's per-warp fragment
and B in the no-swizzle K-major layout, the step's two K halves a leading-byte offset
apart, reproduces a . b^T exactly (small integers, halves and quarters: every product and
sum is exact in float32). What a wgmma consumer for fp8_stream takes as given."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# (k, n): n = 32 is fp8_stream's wgmma consumer (four K blocks side by side as B's rows)
CASES = [(32, 8), (128, 8), (256, 8), (128, 32), (64, 16)]


def kernel_requests(arch: str = "sm_90a") -> list:
    """The compile requests these tests use (for warming a cache without a GPU)."""
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.kernels.wgmma_probe import SPEC, ProbeParams

    return [
        KernelRequest(SPEC.name, SPEC.key_params(ProbeParams(k, n)), arch) for k, n in CASES
    ] + tma_requests(arch)


def _run(k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.kernels.wgmma_probe import ROWS, SPEC, ProbeParams

    request = KernelRequest(SPEC.name, SPEC.key_params(ProbeParams(k, n)), "sm_90a")
    kernel = load_kernel(default_manager().get(request), torch.device("cuda", 0))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randint(-4, 5, (ROWS, k), generator=gen, device="cuda").float()
    b = torch.randint(-4, 5, (n, k), generator=gen, device="cuda").float()
    a[:, 7::29] *= 0.5  # some halves and quarters: still exact, not only integers
    b[:, 3::31] *= 0.25
    out = torch.full((ROWS * n,), float("nan"), device="cuda")
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    kernel.launch([out, a8.view(torch.uint8), b8.view(torch.uint8)])
    torch.cuda.synchronize()
    return out.view(ROWS, n), a8.float() @ b8.float().T


@pytest.mark.parametrize(("k", "n"), CASES)
def test_wgmma_with_mma_sync_fragments_and_lbo_layout_is_exact(k: int, n: int) -> None:
    for seed in range(3):
        got, want = _run(k, n, seed)
        bad = (got != want).sum().item()
        print(f"\n[wgmma_probe] k={k} n={n} seed={seed} mismatches={bad} of {got.numel()}")
        assert bad == 0


TMA_NS = [8, 32]


def tma_requests(arch: str = "sm_90a") -> list:
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.kernels.wgmma_probe import SPEC, ProbeParams

    return [
        KernelRequest(SPEC.name, SPEC.key_params(ProbeParams(128, n, "tma")), arch)
        for n in TMA_NS
    ]


@pytest.mark.parametrize("n", TMA_NS)
def test_wgmma_with_a_by_descriptor_from_a_swizzled_tma_copy_is_exact(n: int) -> None:
    """A from a 3-D TMA box (128 bytes x 16 rows x 4 K blocks, 128-byte swizzle) by a
    descriptor (stride-byte offset 1 KB, the step's 32 bytes added to the start): A's row
    16 j + r is the tile's row r at K block j, the 64 x 128 operand fp8_stream's four
    consecutive blocks would form."""
    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.jit.spec import KernelRequest
    from mlpjit.kernels.tensor_map import weight_block_map
    from mlpjit.kernels.wgmma_probe import ROWS, SPEC, TMA_BLOCKS, TMA_TILE_ROWS, ProbeParams

    request = KernelRequest(SPEC.name, SPEC.key_params(ProbeParams(128, n, "tma")), "sm_90a")
    kernel = load_kernel(default_manager().get(request), torch.device("cuda", 0))
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randint(-4, 5, (TMA_TILE_ROWS, TMA_BLOCKS * 128), generator=gen, device="cuda")
        b = torch.randint(-4, 5, (n, 128), generator=gen, device="cuda").float()
        a = a.float()
        a[:, 7::29] *= 0.5
        b[:, 3::31] *= 0.25
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        a_map = weight_block_map(a8.view(torch.uint8), TMA_TILE_ROWS, TMA_BLOCKS)
        out = torch.full((ROWS * n,), float("nan"), device="cuda")
        kernel.launch([out, a8.view(torch.uint8), b8.view(torch.uint8), a_map])
        torch.cuda.synchronize()
        a_eff = a8.float().view(TMA_TILE_ROWS, TMA_BLOCKS, 128).transpose(0, 1).reshape(ROWS, 128)
        want = a_eff @ b8.float().T
        bad = (out.view(ROWS, n) != want).sum().item()
        print(f"\n[wgmma_probe tma] n={n} seed={seed} mismatches={bad} of {want.numel()}")
        assert bad == 0
