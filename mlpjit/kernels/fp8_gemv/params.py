"""fp8_gemv's compile parameters: one frozen dataclass, its validation and its geometry.

Everything here is plain Python (no cutlass, no torch): the key, the planner and the
CuTe DSL kernel all read the same :class:`GemvParams`, so a shape or tuning rule has one
home. The kernel's numerics and tiling are described in kernel.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from numbers import Real
from typing import Any

from mlpjit.jit.bounds import bounded, shown
from mlpjit.kernels import hopper
from mlpjit.kernels.blocks import BLOCK
from mlpjit.kernels.checks import check_bool, check_choice, check_int

__all__ = [
    "CLUSTER_SIZES",
    "GROUP",
    "KERNEL_ARGS",
    "MAX_HIDDEN",
    "MAX_INTERMEDIATE",
    "MAX_K",
    "MAX_LIMIT",
    "MAX_PENDING_GROUPS",
    "MAX_ROWS",
    "MAX_TOKENS",
    "MAX_WARPS",
    "MBARRIER_BYTES",
    "MIN_LIMIT",
    "SLICE",
    "SLICE_SIZES",
    "SPLITS_MAX",
    "STEPS",
    "TRACE_NAMES",
    "TRACE_POINTS",
    "GemvConfig",
    "GemvParams",
    "check_limit",
    "cta_threads",
    "grid_ctas",
    "is_persistent",
    "smem_bytes",
    "split_slots",
]

SLICE = 512  # K per warp slice by default (slice_k)
STEPS = 8  # 64-K steps per default slice
STEP = 64  # K per step: one 16-byte load per lane covers 4 lanes x 16 K
SLICE_SIZES = (128, 256, 512)  # slice_k: a power-of-two number of 128-groups
GROUP = BLOCK  # activation / weight scale group along K
# K splits of a row tile: the CTAs of one thread block cluster (at most 8, the portable
# cluster size) sum their partials in the first one's shared memory.
SPLITS_MAX = 8
# The mbarrier that counts the bytes the cluster's other CTAs send (the K splits' partials,
# or x's shares with send_x): 8 bytes, 16 for alignment.
MBARRIER_BYTES = 16
PACED_FLAG_BYTES = 16  # a paced kernel's flag word, padded to 16
MAX_TOKENS = 8  # the mma's N
# The largest layer sizes planned: hidden 65536 and an intermediate (shard) of 1M are far
# past every released model (DeepSeek-V3: 7168 and 18432; Llama-3.1-405B: 16384 and
# 53248), and a gate_up weight of 2M x 65536 FP8 bytes (128 GiB) is already about what one
# H200 holds. Sizes past these are refused before any planning, whose searches grow with
# them (hidden 1e18 never finished).
MAX_HIDDEN = 1 << 16
MAX_INTERMEDIATE = 1 << 20
MAX_ROWS = 2 * MAX_INTERMEDIATE  # gate_up of the largest intermediate shard
MAX_K = MAX_INTERMEDIATE  # down of the largest intermediate shard
# The clamped-SwiGLU limit: a finite BF16 number (the clamp compares BF16 values), from the
# smallest normal one to the largest.
MIN_LIMIT = 2.0**-126
MAX_LIMIT = 3.3895313892515355e38
MAX_WARPS = hopper.THREADS_PER_CTA // 32
# cp.async groups one thread may have in flight: ptxas 13.0 encodes the wait count in 6 bits
# (DEPBAR.LE SB0, 0x3f), so slices_per_warp * (steps - in_regs) must stay within it.
MAX_PENDING_GROUPS = 63
# CTAs per thread block cluster that share one quantization of x (1: none); at most 8, the
# portable cluster size.
CLUSTER_SIZES = (1, 2, 4, 8)
# Registers a thread needs for the persistent (row-tile loop) form of the kernel: at 80 it
# spilled, at 168 (384 threads per SM) no GLM-5 config did (ptxas 13.0); at exactly 128
# (512 threads, e.g. k 8192 with 3 register steps) it spilled 16-48 B.
PERSISTENT_MIN_REGS = 136
# The kernel's parameters, in order (all device pointers): output, input, weight, scales.
KERNEL_ARGS = ("out", "x", "w", "w_scale")
# Timestamps per CTA of a ``trace`` build (a developer aid: where a launch spends its time),
# stored after the output (GemvParams.trace_offset): %globaltimer at TRACE_NAMES' points, then
# the CTA's SM id in the last slot.
TRACE_NAMES = ("start", "issued", "waited", "x ready", "sums 1st", "sums last", "done")
TRACE_POINTS = len(TRACE_NAMES) + 1


def cta_threads(
    k: int, tiles: int, slices_per_warp: int = 1, *, slice_k: int = SLICE, splits: int = 1
) -> int:
    """Threads of one CTA: for each of its ``tiles`` 16-row tiles, one warp per
    ``slices_per_warp`` slices of slice_k of its K part (k / splits)."""
    return 32 * tiles * (k // splits // slice_k) // slices_per_warp


def smem_bytes(
    k: int,
    tokens: int,
    tiles: int,
    in_regs: int,
    slices_per_warp: int = 1,
    *,
    slice_k: int = SLICE,
    splits: int = 1,
    send_x: bool = False,
    paced: bool = False,
) -> int:
    """Dynamic shared memory of a specialization: staged weights | activations (reused for
    the partial sums) | x scales | the other splits' partials (first CTA of a cluster) |
    the mbarrier counting what the cluster's other CTAs send (K splits, or send_x) | a
    paced kernel's flag."""
    flag = PACED_FLAG_BYTES if paced else 0
    kc = k // splits
    slices = kc // slice_k
    warps = tiles * slices // slices_per_warp
    staged = tiles * slices * (slice_k // STEP - in_regs) * 2 * 32 * 16
    act = max(tokens * kc, warps * 32 * 16)
    scales = tokens * (kc // GROUP) * 4
    if splits == 1 and not send_x:
        return staged + act + (_align16(scales) + flag if paced else scales)
    return staged + act + _align16(scales) + split_slots(tiles, splits) + MBARRIER_BYTES + flag


def split_slots(tiles: int, splits: int) -> int:
    """Bytes of the other K splits' tile sums in a row tile's first CTA (16 per lane of
    each tile's first warp, per split past the first): also what its mbarrier expects."""
    return (splits - 1) * tiles * 32 * 16


def _align16(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


def is_persistent(rows: int, tiles: int, splits: int, ctas: int) -> bool:
    """Whether a grid of ``ctas`` CTAs loops: fewer CTAs than (16*tiles-row tile, K split)
    units, so a CTA takes several in turn."""
    return ctas < rows // (16 * tiles) * splits


def grid_ctas(
    rows: int,
    k: int,
    tiles: int,
    in_regs: int,
    ctas_per_sm: int,
    slices_per_warp: int = 1,
    sms: int = hopper.SMS,
    *,
    slice_k: int = SLICE,
    splits: int = 1,
) -> int:
    """CTAs launched: one per (16*tiles-row tile, K split), or a persistent grid of one
    resident wave.

    Persistent (sms*ctas_per_sm CTAs; CTA c takes row tiles c, c + grid, ...) when there
    are more tiles than that, at least one step is staged (its slot holds the partial sums)
    and the launch bound leaves PERSISTENT_MIN_REGS registers a thread: x is then quantized
    once per CTA instead of once per tile. At the 80-register bound of 768 threads per SM
    the tile loop spilled 16-104 B with ptxas 13.0 for every GLM-5 config tried, so such
    configs keep one CTA per tile. A K-split grid is made of clusters of ``splits`` CTAs.
    """
    tiles_total = rows // (16 * tiles) * splits
    threads = cta_threads(k, tiles, slices_per_warp, slice_k=slice_k, splits=splits)
    if in_regs >= slice_k // STEP or hopper.reg_budget(threads, ctas_per_sm) < PERSISTENT_MIN_REGS:
        return tiles_total
    # Whole clusters of the K splits, all resident: each takes row tiles c, c + clusters, ...
    slots = hopper.resident_ctas(sms * ctas_per_sm, splits)
    if slots < splits:
        return tiles_total  # not one cluster resident: no persistent form (nor any launch)
    return min(tiles_total, slots // splits * splits)


@dataclass(frozen=True)
class GemvConfig:
    """The tuning knobs of one specialization (the rest of GemvParams is the shape)."""

    tiles: int  # 16-row tiles per CTA
    in_regs: int  # 64-K steps loaded into registers (the rest go through shared memory)
    ctas_per_sm: int  # launch bound: CTAs meant to be resident per SM
    early_launch: bool = False  # PDL trigger at kernel entry instead of after the wait
    # 512-K slices per warp: more means fewer threads (and registers) per row tile, so a
    # persistent grid fits where one warp per slice would spill (large k).
    slices_per_warp: int = 1
    # CTAs per cluster: each quantizes 1/cluster of x and writes it into every CTA's shared
    # memory, so x is read from L2 once per cluster instead of once per CTA.
    cluster: int = 1
    # K per warp slice (128, 256 or 512): smaller slices take K that 512 does not divide.
    slice_k: int = SLICE
    # K splits per row tile, one CTA each (a cluster of that many CTAs): spreads few rows
    # over more SMs, and each CTA reads and quantizes only its k/splits of x.
    splits: int = 1
    # With a cluster: each CTA sends its share of x to the others with st.async, counted on
    # their mbarriers, instead of DSMEM stores met at a fenced cluster barrier. Faster for
    # some kernels, slower for others (docs/KERNEL_NOTES.md, variant 37): a measured choice.
    send_x: bool = False
    # The last late_steps staged steps of each slice are requested after x's loads instead
    # of before the PDL wait, so x's loads wait behind fewer weight requests (one slice per
    # warp only: the cp.async groups must commit in step order).
    late_steps: int = 0
    # Paced staged steps: until the PDL wait returns (seen through a flag the first warp
    # sets), each other warp keeps only this many staged steps in flight, requesting the
    # next as its oldest lands; the steps not yet requested follow x's loads. So the weights
    # stream before the wait with few bytes queued ahead of x (0: all requested at once).
    paced: int = 0


# GemvConfig's field names, each also one of GemvParams': its values are plain ints and
# bools, read directly (dataclasses.asdict copies each one recursively, a planner hot spot).
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(GemvConfig))


def check_limit(limit: Any, name: str = "limit") -> float | None:
    """The clamped-SwiGLU limit as a float (None: no clamp), else a one-line ValueError
    naming ``name``: a finite BF16 number in [MIN_LIMIT, MAX_LIMIT] (bool and str refused:
    a caller's typo, not a number)."""
    if limit is None:
        return None
    try:
        if isinstance(limit, (bool, str)):
            raise ValueError(name)
        if isinstance(limit, Real) and not isinstance(limit, (int, float)):
            limit = float(limit)  # Fraction, numpy scalars: any real number
        return float(bounded(limit, name, MIN_LIMIT, MAX_LIMIT))
    except (ValueError, OverflowError):
        raise ValueError(
            f"{name} must be None or a finite number > 0 within BF16's range "
            f"[{MIN_LIMIT:g}, {MAX_LIMIT:g}], got {shown(limit)}"
        ) from None


@dataclass(frozen=True)
class GemvParams:
    """One specialization of fp8_gemv: the shape, the numerics options and the tuning knobs.

    Construction validates everything the kernel cannot compile (ValueError naming the
    parameter); whether a valid specialization also runs well (no spills, one resident wave)
    is the planner's question (tuning.config_fits).
    """

    rows: int  # weight rows (gate_up: 2 * intermediate shard, gate rows first)
    k: int  # reduction length (hidden, or the intermediate shard)
    tokens: int
    tiles: int
    in_regs: int
    ctas_per_sm: int
    swiglu: bool  # write act = silu(gate) * up (rows/2 columns) instead of out
    limit: float | None  # clamped SwiGLU bound (None: no clamp)
    ue8m0: bool  # activation scales rounded up to powers of two
    early_launch: bool = False
    slices_per_warp: int = 1
    cluster: int = 1
    slice_k: int = SLICE
    splits: int = 1
    send_x: bool = False
    late_steps: int = 0
    paced: int = 0
    sms: int = hopper.SMS  # the target GPU's SM count: sizes a persistent grid
    trace: bool = False  # record TRACE_POINTS stamps per CTA after the output (never planned)

    def __post_init__(self) -> None:
        check_int("rows", self.rows, 16, MAX_ROWS)
        check_int("k", self.k, GROUP, MAX_K)
        check_int("tokens", self.tokens, 1, MAX_TOKENS)
        check_int("tiles", self.tiles, 1)
        check_choice("slice_k", self.slice_k, SLICE_SIZES)
        check_int("splits", self.splits, 1, SPLITS_MAX)
        check_int("in_regs", self.in_regs, 0, self.steps)
        check_int("ctas_per_sm", self.ctas_per_sm, 1, 32)
        for name in ("swiglu", "ue8m0", "early_launch", "send_x", "trace"):
            check_bool(name, getattr(self, name))
        object.__setattr__(self, "limit", check_limit(self.limit))
        if self.k % (self.splits * self.slice_k):
            raise ValueError(
                f"k must be a multiple of splits * slice_k = {self.splits * self.slice_k}, "
                f"got {self.k} (splits={self.splits}, slice_k={self.slice_k})"
            )
        if self.rows % (16 * self.tiles):
            raise ValueError(
                f"rows must be a multiple of 16*tiles = {16 * self.tiles}, got {self.rows}"
            )
        if self.swiglu and self.rows % 2:
            raise ValueError(f"rows must be even with swiglu, got {self.rows}")
        check_int("slices_per_warp", self.slices_per_warp, 1, self.slices)
        if self.slices % self.spw:
            raise ValueError(
                f"slices_per_warp must divide k/splits/slice_k = {self.slices}, "
                f"got {self.slices_per_warp}"
            )
        if self.warps > MAX_WARPS:
            raise ValueError(
                f"tiles * k/splits/slice_k / slices_per_warp = {self.warps} warps exceeds "
                f"{MAX_WARPS}; use fewer tiles, more slices_per_warp or more splits (k={self.k})"
            )
        if self.spw * self.staged > MAX_PENDING_GROUPS:
            raise ValueError(
                f"slices_per_warp * (steps - in_regs) = {self.spw * self.staged} cp.async groups "
                f"in flight per thread; at most {MAX_PENDING_GROUPS} (the wait_group count "
                "ptxas encodes): raise in_regs or lower slices_per_warp"
            )
        hopper.check_sms(self.sms)
        check_choice("cluster", self.cluster, CLUSTER_SIZES)
        if self.cluster > 1 and self.slice_k != SLICE:
            raise ValueError(
                f"cluster must be 1 with slice_k={self.slice_k} (clusters share x in "
                f"{SLICE}-K chunks), got cluster={self.cluster}"
            )
        check_int("late_steps", self.late_steps, 0, self.staged)
        if self.late_steps and self.spw > 1:
            raise ValueError(
                f"late_steps needs slices_per_warp=1 (cp.async groups commit in step order), "
                f"got late_steps={self.late_steps}, slices_per_warp={self.slices_per_warp}"
            )
        if self.send_x and self.cluster == 1:
            raise ValueError(
                "send_x needs cluster > 1 (it is how the CTAs of a cluster share x), got cluster=1"
            )
        if self.splits > 1 and self.cluster > 1:
            raise ValueError(
                f"cluster must be 1 with splits > 1 (the cluster is the tile's {self.splits} "
                f"K splits), got cluster={self.cluster}"
            )
        if hopper.resident_ctas(self.sms * self.ctas_per_sm, self.cluster_ctas) == 0:
            raise ValueError(
                f"a cluster of {self.cluster_ctas} CTAs cannot be resident on {self.sms} SMs "
                f"at ctas_per_sm={self.ctas_per_sm}; use fewer splits or a smaller cluster"
            )
        if self.ctas % self.cluster:
            raise ValueError(
                f"cluster must divide the grid of {self.ctas} CTAs, got {self.cluster}; "
                "pick another cluster size or tiles"
            )
        budget = hopper.smem_budget(self.ctas_per_sm)
        if self.smem_bytes > budget:
            raise ValueError(
                f"configuration needs {self.smem_bytes} B of shared memory per CTA, more than "
                f"{budget} B at ctas_per_sm={self.ctas_per_sm}; raise in_regs (now "
                f"{self.in_regs}), lower tiles (now {self.tiles}) or ctas_per_sm"
            )
        check_int("paced", self.paced, 0, max(self.spw * self.staged - 1, 0))
        if self.paced and (self.late_steps or self.warps < 2):
            raise ValueError(
                "paced needs late_steps=0 and 2 or more warps (it decides the late steps as "
                f"the weights land), got late_steps={self.late_steps}, {self.warps} warps"
            )

    @classmethod
    def of(
        cls,
        rows: int,
        k: int,
        tokens: int,
        config: GemvConfig,
        *,
        swiglu: bool,
        limit: float | None,
        ue8m0: bool,
        sms: int = hopper.SMS,
        trace: bool = False,
    ) -> GemvParams:
        """The params of a shape tuned by ``config``. The clamp only shapes the SwiGLU
        epilogue, so the plain kernel drops it (one compile for every limit)."""
        return cls(
            rows=rows,
            k=k,
            tokens=tokens,
            swiglu=swiglu,
            limit=limit if swiglu else None,
            ue8m0=ue8m0,
            sms=sms,
            trace=trace,
            **{name: getattr(config, name) for name in _CONFIG_FIELDS},
        )

    @property
    def config(self) -> GemvConfig:
        """The tuning knobs of these params."""
        return GemvConfig(**{name: getattr(self, name) for name in _CONFIG_FIELDS})

    # Geometry: all Python constants, compiled into the kernel.
    @property
    def spw(self) -> int:
        return self.slices_per_warp

    @property
    def kc(self) -> int:
        """K of one CTA (one split)."""
        return self.k // self.splits

    @property
    def slices(self) -> int:
        """Warp slices of one CTA's K."""
        return self.kc // self.slice_k

    @property
    def steps(self) -> int:
        """64-K steps per slice."""
        return self.slice_k // STEP

    @property
    def slice_groups(self) -> int:
        """128-groups per slice."""
        return self.slice_k // GROUP

    @property
    def chunk_lanes(self) -> int:
        """Lanes that quantize one slice of one token (16 values each)."""
        return self.slice_k // 16

    @property
    def groups(self) -> int:
        """128-groups of the whole K (the weight scales' row length)."""
        return self.k // GROUP

    @property
    def cta_groups(self) -> int:
        """128-groups of one CTA's K (its x scales per token)."""
        return self.kc // GROUP

    @property
    def warps_per_tile(self) -> int:
        return self.slices // self.spw

    @property
    def warps(self) -> int:
        return self.tiles * self.warps_per_tile

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def staged(self) -> int:
        """64-K steps per slice that go through shared memory (cp.async)."""
        return self.steps - self.in_regs

    @property
    def row_tiles(self) -> int:
        """CTA-sized row tiles (16 * tiles rows each)."""
        return self.rows // (16 * self.tiles)

    @property
    def ctas(self) -> int:
        return grid_ctas(
            self.rows,
            self.k,
            self.tiles,
            self.in_regs,
            self.ctas_per_sm,
            self.spw,
            self.sms,
            slice_k=self.slice_k,
            splits=self.splits,
        )

    @property
    def cluster_ctas(self) -> int:
        """CTAs per launched cluster: the x-sharing cluster, or the K splits of a tile."""
        return self.splits if self.splits > 1 else self.cluster

    @property
    def persistent(self) -> bool:
        """Whether a CTA loops over several row tiles (a grid of one resident wave)."""
        return is_persistent(self.rows, self.tiles, self.splits, self.ctas)

    @property
    def out_cols(self) -> int:
        return self.rows // 2 if self.swiglu else self.rows

    @property
    def trace_offset(self) -> int:
        """Where a trace build's stamps start, in bytes from the output's start (CTA c,
        point i: + (c * TRACE_POINTS + i) * 8): after its tokens x out_cols bf16 values."""
        return _align16(self.tokens * self.out_cols * 2)

    @property
    def out_bytes(self) -> int:
        """The bytes the output argument must hold: the output, and a trace build's stamps."""
        stamps = self.ctas * TRACE_POINTS * 8 if self.trace else 0
        return self.trace_offset + stamps

    @property
    def smem_weights(self) -> int:
        return self.warps * self.spw * self.staged * 2 * 32 * 16

    @property
    def smem_act(self) -> int:
        return max(self.tokens * self.kc, self.warps * 32 * 16)

    @property
    def smem_scales(self) -> int:
        return self.tokens * self.cta_groups * 4

    @property
    def smem_reduce_offset(self) -> int:
        """Where the other splits' partials (16-byte vectors) start, after the x scales."""
        return self.smem_weights + self.smem_act + _align16(self.smem_scales)

    @property
    def smem_mbarrier(self) -> int:
        """Where the mbarrier counting the other CTAs' bytes sits (8-byte aligned): after the
        partials' slots."""
        return self.smem_reduce_offset + split_slots(self.tiles, self.splits)

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(
            self.k,
            self.tokens,
            self.tiles,
            self.in_regs,
            self.spw,
            slice_k=self.slice_k,
            splits=self.splits,
            send_x=self.send_x,
            paced=bool(self.paced),
        )

    @property
    def smem_flag(self) -> int:
        """Where a paced kernel's flag sits (4 bytes: the PDL wait has returned): last."""
        return self.smem_bytes - PACED_FLAG_BYTES

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.ctas, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)
