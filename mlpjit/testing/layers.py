"""Layers for tests, benchmarks and demos: the model presets' shard shapes, random FP8 weights,
and how the benchmarks time a chain of layers and the demos their start-up.

Test and tooling support only: the package never imports it. torch is imported inside the
functions that need it, so the shapes cost nothing to import (a tuning script's ``--emit``
runs without torch; a demo's spawned process times its own torch import).

Random weights follow one recipe: e4m3 values ``randn * w_std`` clamped to +-448 (w_std 64
uses the format's range: 448 is 7 std), then float32 128x128 block scales, both drawn from
the caller's generator on its device in that order. The scales are uniform in [0.5, 1.5)
times a mean ``scale``; ``block_scale(k, std)`` is the mean that gives ``x @ W.T`` a standard
deviation near ``std`` for unit-normal x (``random_fp8_layer``'s default: gate/up near 2,
out near 1), and ``pow2_exponents`` draws power-of-two scales instead (exact in every scale
form, ue8m0 included). GPU tests compare against the reference with tolerances set on these
numbers: changing the recipe changes what they check.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from mlpjit.kernels.blocks import BLOCK, scale_shape
from mlpjit.models import PRESETS, get_preset

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = [
    "DENSE_SHAPES",
    "GRID_SHAPES",
    "GEMV_SHAPES",
    "L2_BYTES_H200",
    "TIMING_SCALE",
    "W_STD",
    "GemvShape",
    "block_scale",
    "capture_graph",
    "copy_bandwidth",
    "dense_shard",
    "device_l2_bytes",
    "gemv_shapes",
    "graph_times",
    "chain_length",
    "layer_bytes",
    "layer_shapes",
    "layers_needed",
    "between_layers",
    "ms",
    "norm_between",
    "norms_alone",
    "output_digest",
    "random_fp8_layer",
    "random_fp8_weight",
    "rel_l2",
    "replay_times",
    "shape_by_name",
    "startup_stats",
    "startup_table",
    "startup_totals",
    "weight_bytes",
]

T = TypeVar("T")

# ---- shapes ------------------------------------------------------------------------------

TP_SIZES = (8, 4, 2, 1)


class GemvShape(NamedTuple):
    """One fp8_gemv launch: weight [rows, k], SwiGLU fused (gate_up) or not (down)."""

    rows: int
    k: int
    swiglu: bool


def dense_shard(model: str, tp: int, layer: str = "dense") -> tuple[int, int]:
    """(hidden, intermediate per rank) over ``tp`` ranks of a model preset's dense MLP
    (``layer`` "dense") or its shared expert ("shared"); aliases are accepted."""
    preset = get_preset(model)
    layers = preset.layers()
    if layer not in layers:
        raise ValueError(f"{preset.name} has no {layer!r} layer; it has {', '.join(layers)}")
    inter = layers[layer]
    if inter % tp:
        raise ValueError(f"tp {tp} does not divide {model}'s {layer} intermediate size {inter}")
    return preset.hidden, inter // tp


def gemv_shapes(hidden: int, inter: int) -> dict[str, GemvShape]:
    """The two launches of one dense-MLP shard: gate_up [2*inter, hidden] and down [hidden,
    inter]."""
    return {"gate_up": GemvShape(2 * inter, hidden, True), "down": GemvShape(hidden, inter, False)}


def _shard_names() -> dict[str, tuple[int, int]]:
    """Every preset's dense MLP ("glm5-tp8") and shared expert ("glm5-shared-tp8") at TP 8,
    4, 2 and 1, where the shard is a whole number of 128-wide scale blocks (what a
    block-quantized FP8 checkpoint can be split into)."""
    shapes = {}
    for name, preset in PRESETS.items():
        for layer, inter in preset.layers().items():
            tag = name if layer == "dense" else f"{name}-{layer}"
            for tp in TP_SIZES:
                if inter % (tp * BLOCK) == 0:
                    shapes[f"{tag}-tp{tp}"] = dense_shard(name, tp, layer)
    return shapes


# "glm5-tp8" / "glm5-shared-tp8" -> (hidden, intermediate per rank), see _shard_names.
DENSE_SHAPES: dict[str, tuple[int, int]] = _shard_names()
# Shapes no preset has ("h3072-i1152": hidden 3072, intermediate shard 1152): what a new
# model gets from the planner alone, the benchmarks' off-table grid.
GRID_HIDDEN = (2048, 3072, 4096, 6144, 7168, 8192)
GRID_INTER = (256, 640, 1152, 1920, 2816, 4864)
GRID_SHAPES: dict[str, tuple[int, int]] = {
    f"h{hidden}-i{inter}": (hidden, inter) for hidden in GRID_HIDDEN for inter in GRID_INTER
}
_FREE_SHAPE = re.compile(r"h([1-9][0-9]*)-i([1-9][0-9]*)")


def shape_by_name(name: str) -> tuple[int, int] | None:
    """(hidden, intermediate shard) of a benchmark shape name: a preset shard
    ("glm5-tp8"), a grid shape, or any "h<hidden>-i<intermediate>" whose sizes are
    multiples of 128 ("h2560-i2304": a layer no model preset has); None otherwise."""
    if name in DENSE_SHAPES:
        return DENSE_SHAPES[name]
    found = _FREE_SHAPE.fullmatch(name)
    if found is None:
        return None
    hidden, inter = int(found[1]), int(found[2])
    if hidden % BLOCK or inter % BLOCK:
        return None
    return hidden, inter


def layer_shapes(names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """shape_by_name of each name, in order; one ValueError naming the unknown ones and
    what a name may be otherwise."""
    shapes = {name: shape_by_name(name) for name in names}
    unknown = [name for name, shape in shapes.items() if shape is None]
    if unknown:
        raise ValueError(
            f"unknown {unknown}; known: {', '.join(DENSE_SHAPES)}, or "
            "h<hidden>-i<intermediate> with both multiples of 128 (e.g. h2048-i256)"
        )
    return shapes


# "glm5-tp8-gate_up" -> GemvShape, both launches of every shard above.
GEMV_SHAPES: dict[str, GemvShape] = {
    f"{name}-{kind}": shape
    for name, (hidden, inter) in DENSE_SHAPES.items()
    for kind, shape in gemv_shapes(hidden, inter).items()
}

# ---- random FP8 weights ------------------------------------------------------------------

W_STD = 64.0  # std of the e4m3 values before the clamp
FP8_MAX = 448.0  # largest finite e4m3 value
# Mean block scale of the benchmarks' weights: GEMV outputs near 1 at k of a few thousand.
TIMING_SCALE = 2.0**-12


def block_scale(k: int, std: float, w_std: float = W_STD) -> float:
    """The mean block scale for which x @ W.T, W [rows, k], has a standard deviation near
    ``std`` when x is unit normal (the e4m3 values have std ``w_std``)."""
    return std / math.sqrt(k) / w_std


def random_fp8_weight(
    rows: int,
    k: int,
    generator: torch.Generator,
    *,
    scale: float | None = None,
    pow2_exponents: tuple[int, int] | None = None,
    w_std: float = W_STD,
) -> tuple[Tensor, Tensor]:
    """(e4m3 weights [rows, k], float32 block scales [rows/128, k/128]) on the generator's
    device: the values first, then the scales, from ``generator``.

    Give ``scale``, the mean of scales uniform in [0.5, 1.5) x scale, or ``pow2_exponents``
    (lo, hi): scales 2**e for integer e uniform in [lo, hi).
    """
    import torch

    if (scale is None) == (pow2_exponents is None):
        raise ValueError("give exactly one of scale and pow2_exponents")
    device = generator.device
    w = torch.randn(rows, k, generator=generator, device=device) * w_std
    w = w.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    blocks = scale_shape(rows, k)
    if pow2_exponents is not None:
        lo, hi = pow2_exponents
        exponents = torch.randint(lo, hi, blocks, generator=generator, device=device)
        return w, 2.0 ** exponents.float()
    return w, (torch.rand(blocks, generator=generator, device=device) + 0.5) * scale


def random_fp8_layer(
    hidden: int,
    inter: int,
    generator: torch.Generator,
    *,
    gate_up_std: float = 2.0,
    out_std: float = 1.0,
    scale: float | None = None,
    pow2_exponents: tuple[int, int] | None = None,
    w_std: float = W_STD,
) -> dict[str, Tensor]:
    """One dense layer as DenseMlp's keyword arguments {w13, w13_scale, w2, w2_scale}, drawn
    in that order from ``generator``.

    By default the block scales are sized so gate/up have a standard deviation near
    ``gate_up_std`` for unit-normal x and out near ``out_std`` for a unit-normal act; a
    ``scale`` or ``pow2_exponents`` (see random_fp8_weight) replaces that for both weights.
    """
    sized = scale is None and pow2_exponents is None

    def weight(rows: int, k: int, std: float) -> tuple[Tensor, Tensor]:
        mean = block_scale(k, std, w_std) if sized else scale
        return random_fp8_weight(
            rows, k, generator, scale=mean, pow2_exponents=pow2_exponents, w_std=w_std
        )

    w13, w13_scale = weight(2 * inter, hidden, gate_up_std)
    w2, w2_scale = weight(hidden, inter, out_std)
    return {"w13": w13, "w13_scale": w13_scale, "w2": w2, "w2_scale": w2_scale}


def weight_bytes(rows: int, k: int) -> int:
    """FP8 bytes of a weight [rows, k] plus its float32 block scales: what a GEMV reads."""
    blocks_rows, blocks_k = scale_shape(rows, k)
    return rows * k + blocks_rows * blocks_k * 4


def layer_bytes(hidden: int, inter: int) -> int:
    """weight_bytes of one dense layer (gate_up and down)."""
    return weight_bytes(2 * inter, hidden) + weight_bytes(hidden, inter)


def chain_length(nbytes: int, l2_bytes: int, multiple: float) -> int:
    """Distinct weight sets of ``nbytes`` each in a chain so their bytes total >= multiple x
    L2 (at least 2): timed chains stream their weights from HBM, not from the L2."""
    return max(2, math.ceil(multiple * l2_bytes / nbytes))


def layers_needed(hidden: int, inter: int, l2_bytes: int, multiple: float) -> int:
    """chain_length of a dense-MLP layer's weights."""
    return chain_length(layer_bytes(hidden, inter), l2_bytes, multiple)


# ---- GPU timing (benchmarks) -------------------------------------------------------------

L2_BYTES_H200 = 60 * 1024 * 1024  # device_l2_bytes where the device does not report its L2


def device_l2_bytes(device: int = 0) -> int:
    """The L2 cache size of CUDA device ``device`` in bytes (what timed chains must exceed),
    or L2_BYTES_H200 where torch does not report it."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or L2_BYTES_H200)


def replay_times(
    graph: Any, replays: int, warmup: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Milliseconds of each of ``replays`` replays of a captured CUDA graph, each timed with
    its own pair of CUDA events, after ``warmup`` untimed replays and then ``before()``."""
    import torch

    for _ in range(warmup):
        graph.replay()
    if before is not None:
        before()
    events = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def capture_graph(fn: Callable[[], T], warmup: Callable[[], object] | None = None) -> tuple[Any, T]:
    """(CUDA graph, fn's result in it): fn() captured once, after ``warmup()`` (default
    fn) ran twice eagerly on a side stream: cuBLAS handles, workspaces and lazy kernel loads
    must not happen during capture."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            (warmup or fn)()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def graph_times(fn: Callable[[], object], replays: int, warmup: int) -> list[float]:
    """Capture fn() once into a CUDA graph (capture_graph); return each timed replay's
    milliseconds."""
    graph, _ = capture_graph(fn)
    times = replay_times(graph, replays, warmup)
    del graph
    return times


def round_order(count: int, rounds: int) -> list[int]:
    """The order in which ``rounds`` rounds time ``count`` variants: every variant once per
    round, odd rounds in reverse, so a drift of the GPU's speed over the run weighs on no
    variant more than on another."""
    if count < 0 or rounds < 1:
        raise ValueError(f"count must be >= 0 and rounds >= 1, got count={count}, rounds={rounds}")
    forward = list(range(count))
    return [i for r in range(rounds) for i in (forward if r % 2 == 0 else forward[::-1])]


SETTLE_TIMINGS = 3  # a process's first timings, discarded (times_in_rounds)
_settled = False  # whether this process has discarded them yet


def times_in_rounds(
    items: Sequence[T], rounds: int, time: Callable[[T], list[float]]
) -> list[list[list[float]]]:
    """Time each of ``items`` once per round in round_order (``time(item)``: one timing's
    samples); per item, its samples of each round, in round order. The process's first
    SETTLE_TIMINGS timings (of ``items[0]``) are discarded: on a freshly started GPU the
    first one or two timings of a run came out up to 11% fast (docs/KERNEL_NOTES.md,
    "Timing a sweep")."""
    global _settled
    if items and not _settled:
        for _ in range(SETTLE_TIMINGS):
            time(items[0])
        _settled = True
    samples: list[list[list[float]]] = [[] for _ in items]
    for i in round_order(len(items), rounds):
        samples[i].append(time(items[i]))
    return samples


def round_summary(rounds: Sequence[Sequence[float]], scale: float = 1.0) -> dict[str, Any]:
    """One variant's time from its rounds (times_in_rounds): ``us`` the mean of the rounds'
    medians (alternating rounds cancel a linear drift in the mean), ``p10_us`` over all
    samples, ``round_us`` each round's median; every value multiplied by ``scale``."""
    medians = [statistics.median(r) * scale for r in rounds]
    flat = sorted(t * scale for r in rounds for t in r)
    return {
        "us": statistics.fmean(medians),
        "p10_us": flat[len(flat) // 10],
        "round_us": [round(m, 4) for m in medians],
    }


def graph_rounds(
    fns: Sequence[Callable[[], object]], rounds: int, replays: int, warmup: int, scale: float
) -> list[dict[str, Any]]:
    """Each of ``fns`` captured once into a CUDA graph, its replays timed in rounds
    (times_in_rounds); per fn, its round_summary of the replays' milliseconds x ``scale``."""
    graphs = [capture_graph(fn)[0] for fn in fns]
    samples = times_in_rounds(graphs, rounds, lambda g: replay_times(g, replays, warmup))
    return [round_summary(r, scale) for r in samples]


def norm_between(x: Tensor) -> None:
    """What a server runs between two MLP layers, for the layer sweeps: one torch
    elementwise kernel that reads and writes ``x`` (its values unchanged) and is launched
    without PDL, so the next layer's kernels start only once it, and so the previous
    layer, is done."""
    x.mul_(1.0)


def between_layers(norm: bool) -> Callable[[Tensor], None]:
    """What a layer chain runs on x before each layer: norm_between with the sweeps'
    --norm-between, else nothing."""
    return norm_between if norm else _no_kernel


def _no_kernel(x: Tensor) -> None:
    """Nothing between the layers (a chain back to back)."""


def norms_alone(x: Tensor, count: int) -> Callable[[], None]:
    """``count`` norm_between kernels on ``x`` and nothing else: the norms' own time, timed
    beside the chains they sit in."""

    def chain() -> None:
        for _ in range(count):
            norm_between(x)

    return chain


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written:
    the denominator of the benchmarks' HBM floor."""
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


# ---- start-up (multi-process demos) ------------------------------------------------------

STAT_FIELDS = ("hits", "misses", "compiles", "lock_waits", "wait_seconds", "compile_seconds")


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for a table."""
    return round(seconds * 1000.0, 1)


def startup_stats(prepare: Callable[[], object]) -> dict[str, Any]:
    """Run ``prepare()`` (a model's prepare, or a warm of its kernel list) and report it:
    ``prepare_ms``, what this process's compile manager did meanwhile (STAT_FIELDS deltas)
    and whether cutlass got imported (it must not be on a warm cache)."""
    from mlpjit.jit.manager import default_manager

    manager = default_manager()
    before = manager.stats
    t0 = time.perf_counter()
    prepare()
    elapsed = time.perf_counter() - t0
    after = manager.stats
    report: dict[str, Any] = {"prepare_ms": ms(elapsed)}
    for name in STAT_FIELDS:
        delta = getattr(after, name) - getattr(before, name)
        report[name] = round(delta, 3) if isinstance(delta, float) else delta
    report["cutlass_imported"] = "cutlass" in sys.modules
    return report


def startup_totals(results: Iterable[dict[str, Any]]) -> str:
    """One line over the processes that reported (no "error"): compiles, hits, lock waits,
    median and max prepare ms; empty if none did."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return ""
    prepare = [r["prepare_ms"] for r in ok]
    return (
        f"total: {sum(r['compiles'] for r in ok)} compiles, {sum(r['hits'] for r in ok)} "
        f"hits, {sum(r['lock_waits'] for r in ok)} lock waits; prepare ms median "
        f"{statistics.median(prepare):.0f}, max {max(prepare):.0f}"
    )


def startup_table(results: Sequence[dict[str, Any]], process: str, phases: Sequence[str]) -> str:
    """A markdown table of per-process start-up reports, one row per process (``process``
    names its column: "rank", "worker"), plus the startup_totals line.

    Columns: the process number, mode, "<phase> ms" for each of ``phases`` (keys
    "<phase>_ms", "-" where missing), prepare ms, the compile manager's stats, whether
    cutlass was imported, capture ms and the step times. A result with "error" shows as
    "error" and dashes.
    """

    def num(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: f"{r[key]:.0f}" if key in r else "-"

    def steps(r: dict[str, Any]) -> str:
        return " / ".join(f"{v:.1f}" for v in r["step_us"].values()) if r.get("step_us") else "-"

    columns: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("mode", lambda r: r["mode"]),
        *((f"{phase} ms", num(f"{phase}_ms")) for phase in (*phases, "prepare")),
        ("hits", lambda r: str(r["hits"])),
        ("compiles", lambda r: str(r["compiles"])),
        ("compile s", lambda r: f"{r['compile_seconds']:.2f}"),
        ("lock waits", lambda r: f"{r['lock_waits']} ({r['wait_seconds']:.2f} s)"),
        ("cutlass", lambda r: "yes" if r["cutlass_imported"] else "no"),
        ("capture ms", num("capture_ms")),
        ("step us (m min / max)", steps),
    ]
    rows = [[process] + [name for name, _ in columns], ["---"] * (len(columns) + 1)]
    for r in results:
        cells = (
            ["error"] + ["-"] * (len(columns) - 1) if "error" in r else [f(r) for _, f in columns]
        )
        rows.append([str(r["rank"]), *cells])
    lines = ["| " + " | ".join(cells) + " |" for cells in rows]
    totals = startup_totals(results)
    return "\n".join(lines + ([f"\n{totals}"] if totals else []))


def output_digest(t: Tensor) -> str:
    """A short sha256 of a bf16 tensor's bits: processes that computed the same outputs
    print the same digest."""
    import torch

    raw = t.detach().contiguous().view(torch.int16).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


# ---- accuracy ------------------------------------------------------------------------------


def rel_l2(got: Tensor, want: Tensor) -> float:
    """||got - want|| / ||want|| in float64 (the tolerance measure of the GPU tests and the
    demos' checks)."""
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))
