"""Compile requests of fp8_gemv: one launch (gemv_request) or both kernels of a dense-MLP
shard for a list of token counts (dense_mlp_requests), planned by tuning.choose_config."""

from __future__ import annotations

from mlpjit.jit.spec import KernelRequest
from mlpjit.kernels import hopper
from mlpjit.kernels.fp8_gemv.params import GemvConfig, GemvParams
from mlpjit.kernels.fp8_gemv.spec import SPEC
from mlpjit.kernels.fp8_gemv.tuning import choose_config, kernel_supports

__all__ = ["dense_mlp_requests", "gemv_request"]


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
) -> KernelRequest:
    """The compile request of one fp8_gemv launch (config defaults to choose_config) for a
    GPU of ``sms`` SMs. ValueError (from GemvParams) for anything the kernel cannot take."""
    hopper.check_sms(sms)
    if config is None:
        config = choose_config(rows, k, tokens, swiglu, sms)
    elif not isinstance(config, GemvConfig):
        raise ValueError(f"config must be a GemvConfig or None, got {config!r}")
    params = GemvParams.of(
        rows, k, tokens, config, swiglu=swiglu, limit=limit, ue8m0=ue8m0, sms=sms
    )
    # Defaults left out, as the key does: requests stay short (and record files readable).
    return KernelRequest(kernel=SPEC.name, params=SPEC.key_params(params), arch=arch)


def dense_mlp_requests(
    hidden: int,
    intermediate: int,
    tp: int,
    tokens: range | list[int] | tuple[int, ...] | int,
    arch: str,
    ue8m0: bool = True,
    limit: float | None = None,
    sms: int = hopper.SMS,
) -> list[KernelRequest]:
    """Both kernels of one TP shard for every token count the kernel takes, planned for a
    GPU of ``sms`` SMs.

    gate_up: rows 2*intermediate/tp, k hidden (SwiGLU fused); down: rows hidden,
    k intermediate/tp. Token counts or shapes the kernel cannot take are skipped (they run
    the stock path and need no compile).
    """
    hopper.check_sms(sms)
    for name, value in (("hidden", hidden), ("intermediate", intermediate), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if intermediate % tp:
        raise ValueError(f"tp must divide intermediate ({intermediate}), got {tp}")
    counts = [tokens] if isinstance(tokens, int) else list(tokens)
    for m in counts:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"tokens must be positive ints, got {m!r}")
    inter = intermediate // tp
    requests = []
    for m in counts:
        if not (
            kernel_supports(2 * inter, hidden, m, sms) and kernel_supports(hidden, inter, m, sms)
        ):
            continue
        for rows, k, swiglu in ((2 * inter, hidden, True), (hidden, inter, False)):
            requests.append(
                gemv_request(
                    rows, k, m, swiglu=swiglu, limit=limit, ue8m0=ue8m0, arch=arch, sms=sms
                )
            )
    return requests
