"""The read-floor benchmark behind scripts/bench_read_floor.py (its docstring: how to run
it): what a kernel that only streams a layer's weight bytes costs, per kernel and per
two-kernel layer, in the same PDL chains and CUDA graphs as the layer benchmarks.

A config names the ring of the read_floor kernel (mlpjit.kernels.read_floor):

- ``r<copy>x<copies>``: a stage is ``copies`` rows x ``copy`` bytes, one bulk copy per row
  at the weight matrix's row stride, as fp8_stream streams a tile (``r2048x16``: its
  default stage of 16 rows x 16 K blocks); ``copy`` is cut to the largest multiple of 128
  that divides the row where it does not.
- ``c<copy>``: a stage is one bulk copy of ``copy`` consecutive bytes.
- then optionally ``s<stages>`` (default: as many as fit RING_BUDGET), ``w<warps>``
  (consumer warps, default 8) and ``g<ctas>`` (default: one per SM; never more than the
  stages to read), ``t``: each stage one TMA tensor copy of the same rows instead of a
  copy per row, landing in wgmma's 128-byte swizzle (``r2048x16t``), and ``d<N>``: each
  CTA reads N stages of a fixed range, then claims the rest one stage at a time from an
  atomic counter after the PDL wait (``r2048x16d2``: dynamic work assignment). With ``t``
  or ``d``, the two-kernel layer and each matrix alone, no one-kernel chains.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.read_floor import ReadParams

__all__ = [
    "DEFAULT_CONFIGS",
    "DEFAULT_SHAPES",
    "ReadConfig",
    "kernel_requests",
    "layer_reads",
    "main",
    "parse_config",
    "read_params",
    "xor_words",
]

ARCH = "sm_90a"
DEFAULT_SHAPES = (
    "glm5-tp8", "glm4.5-tp8", "deepseek-v3-tp8", "qwen3-32b-tp8", "glm5-tp4", "glm5-tp1",
    "deepseek-v3-shared-tp8", "deepseek-v3-shared-tp1",
)  # fmt: skip
DEFAULT_CONFIGS = ("r2048x16", "r2048x16s2", "r1024x16", "r4096x16", "c8192", "c32768")
CHAINS = ("gate_up", "down", "layer", "fused", "flat")
RING_BUDGET = 200 * 1024  # fp8_stream's rings fill about this much beside x
MAX_DEFAULT_STAGES = 32
_CONFIG = re.compile(r"^(?:r(\d+)x(\d+)|c(\d+))(?:s(\d+))?(?:w(\d+))?(?:g(\d+))?(t)?(?:d(\d+))?$")


@dataclass(frozen=True)
class ReadConfig:
    """A parsed config (module docstring); copies None: one copy of consecutive bytes."""

    text: str
    copy_bytes: int
    copies: int | None
    stages: int | None = None
    warps: int = 8
    ctas: int = hopper.SMS
    tensor: bool = False  # 't': a stage is one TMA tensor copy of the same rows
    dynamic: int = 0  # 'd<N>': N stages per CTA in a fixed range, the rest claimed


def parse_config(text: str) -> ReadConfig:
    """The config ``text`` names; ValueError with the grammar where it names none."""
    m = _CONFIG.match(text)
    if not m:
        raise ValueError(
            f"config must be r<copy>x<copies> or c<copy>, then optional s<stages> w<warps> "
            f"g<ctas> t d<fixed stages> (e.g. r2048x16s4, c32768, r2048x16t, r2048x16d2), "
            f"got {text!r}"
        )
    rows_copy, copies, run_copy, stages, warps, ctas, tensor, dynamic = m.groups()
    if dynamic is not None and int(dynamic) < 1:
        raise ValueError(f"config {text!r}: d<N> takes N >= 1 fixed stages per CTA")
    if tensor and not copies:
        raise ValueError(f"config {text!r}: 't' (TMA tensor copies) takes row copies (r...)")
    return ReadConfig(
        text=text,
        copy_bytes=int(rows_copy or run_copy),
        copies=int(copies) if copies else None,
        stages=int(stages) if stages else None,
        warps=int(warps) if warps else 8,
        ctas=int(ctas) if ctas else hopper.SMS,
        tensor=bool(tensor),
        dynamic=int(dynamic) if dynamic else 0,
    )


def _row_copy(row_bytes: int, wanted: int) -> int:
    """The largest multiple of 128 that divides ``row_bytes`` and is at most ``wanted``."""
    for size in range(min(wanted, row_bytes) // 128 * 128, 0, -128):
        if row_bytes % size == 0:
            return size
    raise ValueError(f"no multiple of 128 up to {wanted} divides a row of {row_bytes} B")


def _matrix(config: ReadConfig, rows: int, k: int) -> tuple[int, int, int, int]:
    """(bytes, row bytes, copy bytes, copies) that stream a rows x k FP8 matrix with
    ``config`` (contiguous configs read the whole copies it holds)."""
    if config.copies is None:
        copy = config.copy_bytes
        return rows * k // copy * copy, copy, copy, 1
    return rows * k, k, _row_copy(k, config.copy_bytes), config.copies


def read_params(
    config: ReadConfig,
    rows: int,
    k: int,
    then: tuple[int, int] | None = None,
    barrier: bool = False,
) -> ReadParams:
    """The read_floor params that stream a rows x k FP8 matrix with ``config``, and with
    ``then`` ((rows, k) of a second matrix) that one after it in the same kernel, the
    consumers meeting at a grid-wide ``barrier`` between the two or not."""
    nbytes, row_bytes, copy, copies = _matrix(config, rows, k)
    extra: dict[str, Any] = {}
    units = nbytes // (copies * copy)
    slot = copies * copy
    if then is not None:
        then_nbytes, then_row, then_copy, _ = _matrix(config, *then)
        extra = dict(then_nbytes=then_nbytes, then_row_bytes=then_row,
                     then_copy_bytes=then_copy, barrier=barrier)  # fmt: skip
        units = min(units, then_nbytes // (copies * then_copy))
        slot = copies * max(copy, then_copy)
    stages = config.stages
    if stages is None:
        stages = max(1, min(MAX_DEFAULT_STAGES, RING_BUDGET // slot))
    return ReadParams(
        nbytes=nbytes, row_bytes=row_bytes, copy_bytes=copy, copies=copies, stages=stages,
        warps=config.warps, ctas=min(config.ctas, units), tensor=config.tensor,
        dynamic=config.dynamic, **extra,
    )  # fmt: skip


def layer_reads(hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    """(rows, k) of a dense layer's two weight matrices: gate_up, then down."""
    return {"gate_up": (2 * inter, hidden), "down": (hidden, inter)}


def chains(config: ReadConfig, hidden: int, inter: int) -> dict[str, list[ReadParams]]:
    """The kernels each chain launches per layer: each matrix alone, the two-kernel layer,
    and one kernel reading both (``fused``: its consumers meet at a grid-wide barrier between
    the matrices, as a one-kernel layer's down waits for act; ``flat``: no barrier).
    ValueError where the config cannot take a matrix of the layer."""
    gate_up, down = layer_reads(hidden, inter).values()
    first = read_params(config, *gate_up)
    second = read_params(config, *down)
    if config.tensor or config.dynamic:  # one phase per kernel
        return {"gate_up": [first], "down": [second], "layer": [first, second]}
    return {
        "gate_up": [first],
        "down": [second],
        "layer": [first, second],
        "fused": [read_params(config, *gate_up, then=down, barrier=True)],
        "flat": [read_params(config, *gate_up, then=down)],
    }


def kernel_requests(
    shapes: Sequence[str] = DEFAULT_SHAPES, configs: Sequence[str] = DEFAULT_CONFIGS
) -> list[KernelRequest]:
    """Every read_floor kernel a run of these shapes and configs launches (for warming a
    cache without a GPU); configs a layer cannot take are left out, as the run skips them."""
    from mlpjit.testing.layers import layer_shapes

    requests = []
    for hidden, inter in layer_shapes(shapes).values():
        for text in configs:
            try:
                kernels = chains(parse_config(text), hidden, inter)
            except ValueError:
                continue
            for params_list in kernels.values():
                for params in params_list:
                    request = KernelRequest("read_floor", vars(params).copy(), ARCH)
                    if request not in requests:
                        requests.append(request)
    return requests


def xor_words(t: Any) -> int:
    """XOR of every int32 word of a uint8 CUDA tensor (whose length is a multiple of 4)."""
    import torch

    words = t.view(torch.int32)
    while words.numel() > 1:
        if words.numel() % 2:
            words = torch.cat([words, words.new_zeros(1)])
        half = words.numel() // 2
        words = words[:half] ^ words[half:]
    return int(words.item())


def _tensor_map(params: ReadParams, buf: Any) -> tuple:  # pragma: no cover - GPU only
    """(the buffer's tensor map,) for a ``tensor`` kernel, () otherwise."""
    if not params.tensor:
        return ()
    from mlpjit.kernels.tensor_map import weight_block_map

    matrix = buf.view(-1, params.row_bytes)
    return (weight_block_map(matrix, params.copies, params.copy_bytes // 128),)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:  # pragma: no cover - GPU only
    import torch

    from mlpjit.jit.launcher import load_kernel
    from mlpjit.jit.manager import default_manager
    from mlpjit.testing.layers import (
        chain_length,
        copy_bandwidth,
        device_l2_bytes,
        graph_times,
        layer_shapes,
    )

    l2 = device_l2_bytes()
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.3f} TB/s "
          f"(read + write), L2 {l2 >> 20} MiB", flush=True)  # fmt: skip
    manager = default_manager()
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out: list[dict[str, Any]] = []
    for name, (hidden, inter) in layer_shapes(args.shapes).items():
        for text in args.configs:
            try:
                per_chain = chains(parse_config(text), hidden, inter)
            except ValueError as err:
                print(f"{name} {text}: skipped ({err})", flush=True)
                continue
            for chain_name, kernels_params in per_chain.items():
                if args.chains and chain_name not in args.chains:
                    continue
                kernels = [
                    load_kernel(manager.get(KernelRequest("read_floor", vars(p).copy(), ARCH)),
                                device)
                    for p in kernels_params
                ]  # fmt: skip
                nbytes = sum(p.total_bytes for p in kernels_params)
                count = chain_length(nbytes, l2, args.l2_multiple)
                bufs = [
                    [torch.randint(0, 256, (p.total_bytes,), dtype=torch.uint8, device=device,
                                   generator=gen) for p in kernels_params]
                    for _ in range(count)
                ]  # fmt: skip
                outs = [
                    torch.zeros(p.out_words, dtype=torch.int32, device=device)
                    for p in kernels_params
                ]  # fmt: skip (the counters start at zero)
                args_of = [
                    [(buf,) + _tensor_map(p, buf) for p, buf in zip(kernels_params, layer,
                                                                     strict=True)]
                    for layer in bufs
                ]  # fmt: skip

                def chain(args_of=args_of, outs=outs, kernels=kernels):
                    for layer in args_of:
                        for kernel, out, args in zip(kernels, outs, layer, strict=True):
                            kernel.launch((out, *args))

                chain()
                torch.cuda.synchronize()
                for p, out, buf in zip(kernels_params, outs, bufs[-1], strict=True):
                    if xor_words(out[: p.thread_words].view(torch.uint8)) != xor_words(buf):
                        raise SystemExit(f"{name} {text} {chain_name}: a byte was not read once")
                times = graph_times(chain, args.replays, args.warmup)
                us = statistics.median(times) * 1e3 / count
                floor_us = nbytes / bandwidth * 1e6
                row = dict(
                    shape=name, config=text, chain=chain_name, us=round(us, 3),
                    floor_us=round(floor_us, 3), x_floor=round(us / floor_us, 3),
                    mbytes=round(nbytes / 1e6, 2), count=count,
                    params=[vars(p) for p in kernels_params],
                )  # fmt: skip
                rows_out.append(row)
                print(f"{name:24s} {text:14s} {chain_name:8s} {us:8.2f} us  "
                      f"x{us / floor_us:5.2f} floor {floor_us:7.2f} us", flush=True)  # fmt: skip
                del bufs
    return rows_out


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Parse the command line; --emit writes the compile requests, else time on the GPU."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                   help="comma list of layer names or h<hidden>-i<intermediate>")  # fmt: skip
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="comma list (above)")
    p.add_argument("--chains", default="",
                   help="comma list of chains to time (gate_up, down, layer, fused, flat); "
                        "default: every chain a config has")  # fmt: skip
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--l2-multiple", type=float, default=4.0)
    p.add_argument("--emit", help="write the compile requests (JSON lines) and stop")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.configs = [c for c in args.configs.split(",") if c]
    args.chains = [c for c in args.chains.split(",") if c]
    unknown = sorted(set(args.chains) - set(CHAINS))
    if unknown:
        p.error(f"--chains takes {', '.join(CHAINS)}, got {', '.join(unknown)}")
    try:
        for text in args.configs:
            parse_config(text)
        from mlpjit.testing.layers import layer_shapes

        layer_shapes(args.shapes)
    except ValueError as err:
        p.error(str(err))
    if args.emit:
        requests = kernel_requests(args.shapes, args.configs)
        with open(args.emit, "w") as f:
            for r in requests:
                f.write(r.to_json_line() + "\n")
        print(f"{len(requests)} requests -> {args.emit}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_read_floor: needs a CUDA GPU (--emit works without one)", file=sys.stderr)
        return 1
    rows = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
