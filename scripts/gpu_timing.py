"""Helpers shared by the benchmark scripts: CUDA-graph replay times, copy bandwidth, random
FP8 weights, config labels."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def graph_times(fn: Callable[[], object], replays: int, warmup: int) -> list[float]:
    """Capture fn() once into a CUDA graph; return each timed replay's milliseconds."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # eager warm-up: cuBLAS handles, workspaces, lazy kernel loads
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    del graph
    return times


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def random_fp8_matrix(rows: int, k: int, gen: Any) -> tuple[Any, Any]:
    """Random e4m3 weights [rows, k] over the FP8 range and float32 128x128 block scales
    around 1/4096 (so GEMV outputs stay near 1), on CUDA from generator ``gen``."""
    import torch

    w = torch.randn(rows, k, generator=gen, device="cuda").mul_(64).clamp_(-448, 448)
    scale = torch.rand(rows // 128, k // 128, generator=gen, device="cuda").add_(0.5) / 4096
    return w.to(torch.float8_e4m3fn), scale


def config_label(
    tiles: int,
    in_regs: int,
    ctas_per_sm: int,
    slices_per_warp: int = 1,
    early: bool = False,
    cluster: int = 1,
) -> str:
    """'t4/r3/c2', with '/s3' for several slices per warp, '/n2' for a cluster of 2 CTAs and
    '/early' for the early trigger."""
    spw = f"/s{slices_per_warp}" if slices_per_warp != 1 else ""
    clu = f"/n{cluster}" if cluster != 1 else ""
    return f"t{tiles}/r{in_regs}/c{ctas_per_sm}{spw}{clu}{'/early' if early else ''}"
