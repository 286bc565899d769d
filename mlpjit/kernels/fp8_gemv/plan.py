"""fp8_gemv's compile requests: one launch (gemv_request), its config from
tuning.choose_config unless given. Which kernel runs each half of a dense-MLP layer is the
layer planner's question (mlpjit.layer_plan), outside this package: its rules are no part
of fp8_gemv's cache key.

The SM count is checked against hopper's range and every size against its documented
maximum (params.MAX_ROWS, MAX_K) before any planning, so a huge or bad value is a one-line
ValueError naming it, never a search that does not finish.
"""

from __future__ import annotations

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv.params import GemvConfig, GemvParams
from mlpjit.kernels.fp8_gemv.spec import SPEC
from mlpjit.kernels.fp8_gemv.tuning import choose_config

__all__ = ["gemv_request"]


def gemv_request(
    rows: int,
    k: int,
    tokens: int,
    *,
    swiglu: bool,
    limit: float | None,
    ue8m0: bool,
    arch: str,
    config: GemvConfig | None = None,
    sms: int = hopper.SMS,
    trace: bool = False,
) -> KernelRequest:
    """The compile request of one fp8_gemv launch (config defaults to choose_config) for a
    GPU of ``sms`` SMs; ``trace``: the build that records per-CTA timestamps after its
    output (a developer aid). ValueError (from GemvParams) for anything the kernel cannot
    take."""
    hopper.check_sms(sms)
    if config is None:
        config = choose_config(rows, k, tokens, swiglu, sms)
    elif not isinstance(config, GemvConfig):
        raise ValueError(f"config must be a GemvConfig or None, got {config!r}")
    params = GemvParams.of(
        rows, k, tokens, config, swiglu=swiglu, limit=limit, ue8m0=ue8m0, sms=sms, trace=trace
    )
    # Defaults left out, as the key does: requests stay short (and record files readable).
    return KernelRequest(kernel=SPEC.name, params=SPEC.key_params(params), arch=arch)
