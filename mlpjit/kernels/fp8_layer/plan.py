"""fp8_layer's compile requests: the knobs follow from the shape and the shared-memory
budget (no table). Each ring holds at most what its phase's range can fill; when both fit,
every weight byte of the layer is requested at launch. Otherwise gate_up's ring gets the
room (its stream is the critical path) and down's keeps MIN_DOWN_STAGES, enough to have
down's first bytes in shared memory when act is ready. Stages are two blocks per consumer
warp (2 KB bulk copies, fp8_stream's default) unless one block per warp is what lets every
byte be in flight at once or lets the layer fit at all (many tokens: x takes room)."""

from __future__ import annotations

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_layer.params import LayerParams
from mlpjit.kernels.fp8_layer.spec import SPEC
from mlpjit.kernels.fp8_stream.plan import (
    DEFAULT_BLOCKS_PER_WARP,
    DEFAULT_WARPS,
    MAX_STAGES,
    MIN_STAGES,
)

__all__ = ["MIN_DOWN_STAGES", "choose_stages", "layer_params", "layer_request"]

MIN_DOWN_STAGES = 2


def _most_stages(blocks: int, ctas: int, stage_blocks: int) -> int:
    """Stages a CTA's range can fill: its blocks over a stage, plus one per segment."""
    per_cta = -(-blocks // ctas)
    return min(MAX_STAGES, -(-per_cta // stage_blocks) + 3)


def choose_stages(
    hidden: int,
    inter: int,
    tokens: int,
    warps: int,
    blocks_per_warp: int,
    sms: int = hopper.SMS,
) -> tuple[int, int]:
    """(stages_gate_up, stages_down) within one CTA's shared memory; ValueError naming the
    shape when not even two stages each fit."""
    most_g, most_d = _full_stages(hidden, inter, warps, blocks_per_warp, sms)

    def fits(sg: int, sd: int) -> bool:
        try:
            LayerParams(
                hidden=hidden, inter=inter, tokens=tokens, limit=None, ue8m0=True,
                stages_gate_up=sg, stages_down=sd, warps=warps,
                blocks_per_warp=blocks_per_warp, sms=sms,
            )  # fmt: skip
        except ValueError:
            return False
        return True

    if fits(most_g, most_d):
        return most_g, most_d
    floor_d = min(MIN_DOWN_STAGES, most_d)
    for sg in range(most_g, MIN_STAGES - 1, -1):
        if fits(sg, floor_d):
            sd = next(s for s in range(most_d, floor_d - 1, -1) if fits(sg, s))
            return sg, sd
    raise ValueError(
        f"fp8_layer cannot hold two ring stages per phase for hidden={hidden}, "
        f"inter={inter} and {tokens} tokens in shared memory"
    )


def _choose_blocks_and_stages(
    hidden: int, inter: int, tokens: int, warps: int, sms: int
) -> tuple[int, tuple[int, int]]:
    picks = {}
    for bpw in (DEFAULT_BLOCKS_PER_WARP, 1):
        try:
            picks[bpw] = choose_stages(hidden, inter, tokens, warps, bpw, sms)
        except ValueError:
            continue
    if not picks:  # the error names the shape
        choose_stages(hidden, inter, tokens, warps, 1, sms)
    full = [bpw for bpw, st in picks.items() if st == _full_stages(hidden, inter, warps, bpw, sms)]
    bpw = full[0] if full else next(iter(picks))
    return bpw, picks[bpw]


def _full_stages(hidden: int, inter: int, warps: int, bpw: int, sms: int) -> tuple[int, int]:
    stage_blocks = warps * bpw
    return (
        _most_stages(2 * inter // 16 * (hidden // 128), sms, stage_blocks),
        _most_stages(hidden // 16 * (inter // 128), sms, stage_blocks),
    )


def layer_params(
    hidden: int,
    inter: int,
    tokens: int,
    *,
    limit: float | None,
    ue8m0: bool,
    warps: int | None = None,
    blocks_per_warp: int | None = None,
    stages: tuple[int, int] | None = None,
    sms: int = hopper.SMS,
    trace: bool = False,
) -> LayerParams:
    """The params of one layer launch; knobs left None follow from the shape."""
    hopper.check_sms(sms)
    warps = DEFAULT_WARPS if warps is None else warps
    if blocks_per_warp is None:
        blocks_per_warp, stages = _choose_blocks_and_stages(hidden, inter, tokens, warps, sms)
    if stages is None:
        stages = choose_stages(hidden, inter, tokens, warps, blocks_per_warp, sms)
    return LayerParams(
        hidden=hidden, inter=inter, tokens=tokens, limit=limit, ue8m0=ue8m0,
        stages_gate_up=stages[0], stages_down=stages[1], warps=warps,
        blocks_per_warp=blocks_per_warp, sms=sms, trace=trace,
    )  # fmt: skip


def layer_request(hidden: int, inter: int, tokens: int, *, arch: str, **options) -> KernelRequest:
    """The compile request of one layer launch (options: see layer_params)."""
    params = layer_params(hidden, inter, tokens, **options)
    return KernelRequest(kernel=SPEC.name, params=SPEC.key_params(params), arch=arch)
