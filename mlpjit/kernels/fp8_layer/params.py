"""fp8_layer's compile parameters: a whole dense MLP layer (gate_up + SwiGLU, then down) in
one kernel, built from two fp8_stream phases that share the grid, the warps and the
shared memory (plain Python: no cutlass, no torch).

Each phase splits its own (16-row tile, 128-K block) pairs evenly over the one resident
wave, as fp8_stream does; the producer warp streams down's weights as soon as gate_up's are
all requested, so the kernel boundary of a two-kernel layer (launch, wait, ramp) is gone.
Act goes through global memory (the ``act`` argument) and an arrival counter.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpjit.kernels import hopper
from mlpjit.kernels.checks import check_bool, check_int
from mlpjit.kernels.fp8_gemv.params import MAX_K, MAX_ROWS, check_limit
from mlpjit.kernels.fp8_stream.params import MAX_TOKENS, StreamParams

__all__ = ["COUNTER_BYTES", "KERNEL_ARGS", "LayerParams"]

# The kernel's parameters, in order (device pointers).
KERNEL_ARGS = ("out", "act", "x", "w13", "w13_scale", "w2", "w2_scale", "workspace")
# The layer's two counters (act tiles announced, CTAs past the wait), after both phases'
# workspaces.
COUNTER_BYTES = 8


@dataclass(frozen=True)
class LayerParams:
    """One specialization: the layer shape, numerics options and the knobs of its phases.

    ``warps`` and ``blocks_per_warp`` are shared by both phases (same threads);
    ``stages_gate_up`` and ``stages_down`` split the shared memory between the two rings.
    """

    hidden: int
    inter: int
    tokens: int
    limit: float | None
    ue8m0: bool
    stages_gate_up: int
    stages_down: int
    warps: int = 8
    blocks_per_warp: int = 2
    sms: int = hopper.SMS
    trace: bool = False

    def __post_init__(self) -> None:
        check_int("hidden", self.hidden, 128, min(MAX_K, MAX_ROWS))
        check_int("inter", self.inter, 128, min(MAX_K, MAX_ROWS // 2))
        check_int("tokens", self.tokens, 1, MAX_TOKENS)
        check_int("warps", self.warps, 1, 16)
        check_int("blocks_per_warp", self.blocks_per_warp, 1, 4)
        hopper.check_sms(self.sms)
        for name in ("ue8m0", "trace"):
            check_bool(name, getattr(self, name))
        object.__setattr__(self, "limit", check_limit(self.limit))
        for name in ("hidden", "inter"):
            if getattr(self, name) % 128:
                raise ValueError(f"{name} must be a multiple of 128, got {getattr(self, name)}")
        for phase in (self.gate_up, self.down):  # validates the stages and each phase alone
            if phase.blocks < self.sms:
                raise ValueError(
                    f"fp8_layer needs at least {self.sms} blocks per phase (one per CTA), "
                    f"got {phase.blocks} for {phase.rows}x{phase.k}"
                )
        budget = hopper.smem_budget(1)
        if self.smem_bytes > budget:
            raise ValueError(
                f"fp8_layer needs {self.smem_bytes} B of shared memory per CTA, more than "
                f"{budget} B; lower stages_gate_up or stages_down"
            )

    def _phase(self, rows: int, k: int, swiglu: bool, stages: int) -> StreamParams:
        return StreamParams(
            rows=rows, k=k, tokens=self.tokens, swiglu=swiglu,
            limit=self.limit if swiglu else None, ue8m0=self.ue8m0, warps=self.warps,
            stages=stages, sms=self.sms, trace=self.trace, blocks_per_warp=self.blocks_per_warp,
        )  # fmt: skip

    @property
    def gate_up(self) -> StreamParams:
        return self._phase(2 * self.inter, self.hidden, True, self.stages_gate_up)

    @property
    def down(self) -> StreamParams:
        return self._phase(self.hidden, self.inter, False, self.stages_down)

    # Shared memory: gate_up's region | down's region (each fp8_stream's layout).
    @property
    def smem_down(self) -> int:
        return _align(self.gate_up.smem_bytes, 128)

    @property
    def smem_bytes(self) -> int:
        return self.smem_down + self.down.smem_bytes

    # Workspace: gate_up's | down's | the two counters.
    @property
    def work_down(self) -> int:
        return _align(self.gate_up.workspace_bytes, 16)

    @property
    def work_counters(self) -> int:
        return _align(self.work_down + self.down.workspace_bytes, 16)

    @property
    def workspace_bytes(self) -> int:
        return self.work_counters + COUNTER_BYTES

    @property
    def ctas(self) -> int:
        return self.sms

    @property
    def threads(self) -> int:
        return self.gate_up.threads

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.ctas, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)


def _align(nbytes: int, to: int) -> int:
    return -(-nbytes // to) * to
