"""`mlpjit warm`: compile kernels into the cache (no GPU needed).

The request list comes from mlpjit.planning (a model preset, a hidden/intermediate pair, a
checkpoint, a kernel's parameter grid or a request file); mlpjit.warm_pool compiles it in
this process or in worker processes. This module parses the options and prints.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from mlpjit.cli import output
from mlpjit.cli.values import (
    MAX_WARM_TOKENS,
    arch_arg,
    arg_type,
    bounded_int,
    check_settings,
    layers_arg,
    limit_arg,
    param_arg,
    parse_tokens,
)
from mlpjit.errors import UsageError
from mlpjit.kernels.fp8_gemv.params import MAX_HIDDEN, MAX_INTERMEDIATE
from mlpjit.kernels.hopper import MAX_SMS, MIN_SMS
from mlpjit.models import PRESET_NAMES, PRESETS
from mlpjit.planning import MAX_PARAM_REQUESTS

if TYPE_CHECKING:
    from mlpjit.jit.spec import KernelRequest

__all__ = ["DEFAULT_TP", "MAX_JOBS", "MAX_TP", "add_parser", "default_jobs"]

# Largest --tp and --jobs: no deployment shards one layer over more GPUs, and more worker
# processes than this would only queue on the machine's cores.
MAX_TP = 1024
MAX_JOBS = 256
DEFAULT_TP = 1
# Most workers --jobs defaults to: each worker holds a CuTe DSL compiler (about a GiB).
MAX_DEFAULT_JOBS = 8


def default_jobs() -> int:
    """--jobs default: half the CPUs (a compile takes one core; the rest keep the machine
    usable), at least 1, at most MAX_DEFAULT_JOBS."""
    return max(1, min(MAX_DEFAULT_JOBS, (os.cpu_count() or 1) // 2))


def _presets_text() -> str:
    """The --model presets for --help: "glm5 (hidden 6144, dense 12288, shared 2048); ...",
    aliases after their preset."""
    parts = []
    for name, p in PRESETS.items():
        shared = f", shared {p.shared_intermediate}" if p.shared_intermediate else ""
        aliases = f", also {', '.join(p.aliases)}" if p.aliases else ""
        parts.append(f"{name} (hidden {p.hidden}, dense {p.intermediate}{shared}{aliases})")
    return "; ".join(parts)


def _int_option(group: Any, flag: str, high: int, help_text: str) -> None:
    """Add an int option within [1, high] (default None): anything else is a usage error
    naming it."""
    group.add_argument(
        flag, type=arg_type(bounded_int(flag, 1, high)), help=f"{help_text}; 1-{high}"
    )


def add_parser(commands: Any, sub: Any) -> None:
    """Add `warm` to the ``commands`` subparsers (``sub`` makes a command's parser)."""
    warm = sub(commands, "warm", run, "compile kernels into the cache (no GPU needed)")
    warm.set_defaults(check=check)
    what = warm.add_mutually_exclusive_group(required=True)
    what.add_argument("--kernel", help="a registered kernel name (e.g. fp8_gemv)")
    what.add_argument(
        "--model",
        choices=PRESET_NAMES,
        metavar="NAME",
        help=f"a model preset, full (unsharded) sizes: {_presets_text()}; warms its "
        "--layers at --tp",
    )
    _int_option(what, "--hidden", MAX_HIDDEN, "hidden size (with --intermediate)")
    what.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="a Hugging Face FP8 checkpoint dir: warm the dense-MLP and shared-expert shapes "
        "its config.json gives (with --tp)",
    )
    what.add_argument(
        "--from",
        "--requests",
        dest="requests",
        metavar="FILE",
        help="replay JSON lines of requests, e.g. a file written through MLPJIT_RECORD",
    )
    warm.add_argument(
        "--param",
        action="append",
        default=[],
        type=arg_type(lambda text: param_arg(text, MAX_PARAM_REQUESTS)),
        metavar="NAME=VALUE[,VALUE...]",
        help="compile parameter of --kernel; a value list multiplies the requests",
    )
    warm.add_argument(
        "--layers",
        type=arg_type(layers_arg),
        default=None,
        metavar="dense,shared",
        help="with --model: its dense MLP layers and/or its MoE layers' shared expert, each "
        "sharded intermediate/tp (default both; a model without a shared expert warms dense)",
    )
    _int_option(warm, "--intermediate", MAX_INTERMEDIATE, "full intermediate size")
    _int_option(
        warm,
        "--tp",
        MAX_TP,
        f"tensor-parallel size the layers are sharded over (default {DEFAULT_TP}; the "
        "summary says when the default was used)",
    )
    warm.add_argument(
        "--tokens",
        type=arg_type(parse_tokens),
        default=list(range(1, 9)),
        help=f"token counts, e.g. 1-8 or 1,2,4 (within 1-{MAX_WARM_TOKENS}; the kernels take "
        "1-8, more tokens run the stock path); default 1-8",
    )
    warm.add_argument(
        "--arch",
        type=arg_type(arch_arg),
        help="target, e.g. sm_90a, the only one the fp8 kernels compile for (default: "
        "MLPJIT_ARCH, else the GPU's)",
    )
    warm.add_argument(
        "--sms",
        type=arg_type(bounded_int("--sms", MIN_SMS, MAX_SMS)),
        default=None,
        help="SM count of the target GPU, which sizes persistent grids (default: the GPU's "
        "here, else 132 as on the H200 and H100 SXM; H100/H800 PCIe 114, H20 78; within "
        f"{MIN_SMS}-{MAX_SMS})",
    )
    warm.add_argument(
        "--ue8m0",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="power-of-two (UE8M0) activation scales (default: on, as DenseMlp; with "
        "--checkpoint, what its quantization_config.scale_fmt says where it says)",
    )
    warm.add_argument(
        "--limit",
        type=arg_type(limit_arg),
        default=None,
        help="clamped-SwiGLU limit, a finite BF16 number > 0 (default: no clamp)",
    )
    _int_option(
        warm,
        "--jobs",
        MAX_JOBS,
        f"worker processes compiling in parallel (default: half the CPUs, at most "
        f"{MAX_DEFAULT_JOBS}: {default_jobs()} here; never more than the kernels to compile)",
    )
    warm.add_argument("--dry-run", action="store_true", help="list the kernels, compile nothing")


def check(args: argparse.Namespace) -> None:
    """Options that only go together: a usage error (exit status 2) otherwise."""
    if args.param and not args.kernel:
        args.parser.error("--param goes with --kernel")
    if args.intermediate is not None and args.hidden is None:
        args.parser.error("--intermediate goes with --hidden")
    if args.layers is not None and not args.model:
        args.parser.error("--layers goes with --model")
    args.tp_defaulted = args.tp is None
    if args.tp is None:
        args.tp = DEFAULT_TP


def run(args: argparse.Namespace) -> int:
    """`mlpjit warm`: plan, then compile (or list with --dry-run)."""
    from mlpjit.planning import check_requests, register_kernels

    check_settings()
    register_kernels()
    if args.requests:
        # Each line names its arch; --arch (if given) overrides them all.
        requests = warm_requests(args, args.arch or "")
        arch = ",".join(sorted({r.arch for r in requests})) or (args.arch or "")
    else:
        arch = _target_arch(args)
        requests = warm_requests(args, arch)
    check_requests(requests)
    if args.dry_run:
        return _dry_run(args, arch, requests)
    return _warm(args, arch, requests)


def _tp_text(args: argparse.Namespace) -> str:
    """' at tp N' for the sharded modes, saying when N is the default; '' otherwise."""
    if args.kernel or args.requests:
        return ""
    default = " (the default; pass --tp)" if args.tp_defaulted else ""
    return f" at tp {args.tp}{default}"


def _warm(args: argparse.Namespace, arch: str, requests: list[KernelRequest]) -> int:
    from mlpjit.jit.store import CacheStore
    from mlpjit.warm_pool import warm_in_process, warm_in_workers

    t0 = time.perf_counter()
    jobs = args.jobs if args.jobs is not None else default_jobs()
    workers = min(jobs, _missing(requests))
    records = warm_in_workers(requests, workers) if workers > 1 else warm_in_process(requests)
    compiled = sum(r["status"] == "compiled" for r in records)
    data = {
        "arch": arch,
        "root": str(CacheStore().root),
        "total": len(records),
        "compiled": compiled,
        "compiles": sum(r["compiles"] for r in records),
        "hits": len(records) - compiled,
        "jobs": jobs,
        "workers": workers,
        "tp": None if args.kernel or args.requests else args.tp,
        "seconds": round(time.perf_counter() - t0, 3),
        "entries": records,
    }
    started = f"{workers} worker processes" if workers > 1 else "in process"
    line = (
        f"warmed {data['total']} kernels for {arch}{_tp_text(args)}: {compiled} compiled, "
        f"{data['hits']} hits in {data['seconds']:.1f} s ({started}, --jobs {jobs}); "
        f"cache {data['root']}"
    )
    output.emit(args.json, data, lambda: [line])
    return 0


def _missing(requests: list[KernelRequest]) -> int:
    """How many of ``requests`` have no entry in the cache yet (what workers could share)."""
    from mlpjit.jit.key import request_key
    from mlpjit.jit.store import CacheStore

    cached = {key for key, _ in CacheStore().iter_manifests()}
    return len({request_key(r) for r in requests} - cached)


def _dry_run(args: argparse.Namespace, arch: str, requests: list[KernelRequest]) -> int:
    """List what warm would compile (key, kernel, params, already cached?) without compiling."""
    from mlpjit.jit.key import request_key
    from mlpjit.jit.store import CacheStore

    cached = {key for key, _ in CacheStore().iter_manifests()}
    rows = []
    for r in requests:
        key = request_key(r)
        rows.append(
            {"key": key, "kernel": r.kernel, "params": dict(r.params), "cached": key in cached}
        )
    data = {
        "arch": arch,
        "tp": None if args.kernel or args.requests else args.tp,
        "total": len(rows),
        "cached": sum(r["cached"] for r in rows),
        "entries": rows,
    }

    def lines() -> list[str]:
        out = [
            f"{r['key'][:12]}  {r['kernel']}  {output.params_text(r['params'])}  "
            f"{'cached' if r['cached'] else 'to compile'}"
            for r in rows
        ]
        out.append(
            f"{data['total']} kernels for {arch}{_tp_text(args)}, {data['cached']} already cached"
        )
        return out

    output.emit(args.json, data, lines)
    return 0


def _local_arch() -> str | None:
    """The kernel arch of the current GPU, as DenseMlp picks it ("sm_90a" on Hopper), or
    None without a GPU the kernels run on."""
    from mlpjit.device import current_cuda_device, kernel_arch

    device = current_cuda_device()
    return None if device is None else kernel_arch(device)


def _target_sms(args: argparse.Namespace) -> int:
    """--sms, else the current GPU's SM count when the kernels run on it, else hopper.SMS."""
    from mlpjit.kernels.hopper import SMS

    if args.sms is not None:
        return args.sms
    if _local_arch() is None:
        return SMS
    from mlpjit.device import current_cuda_device, device_sms

    return device_sms(current_cuda_device())


def _target_arch(args: argparse.Namespace) -> str:
    from mlpjit.jit.config import arch_override

    try:
        arch = args.arch or arch_override() or _local_arch()
    except ValueError as err:  # a malformed MLPJIT_ARCH
        raise UsageError(str(err), argument="MLPJIT_ARCH") from None
    if arch is None:
        raise UsageError(
            "no target arch: pass --arch (e.g. --arch sm_90a), set MLPJIT_ARCH, or run on a "
            "machine with a GPU the kernels support (Hopper, sm_90a)",
            argument="--arch",
        )
    return arch


def warm_requests(args: argparse.Namespace, arch: str) -> list[KernelRequest]:
    """The kernel list of `mlpjit warm` from --kernel/--param, --model/--hidden,
    --checkpoint or --from; notes about stock-path layers go to stderr."""
    from mlpjit import planning

    if args.sms is not None and (args.kernel or args.requests):
        raise UsageError(
            "--sms plans --model/--hidden kernels; with --kernel give it as --param sms=N, "
            "a --requests file carries it in each request",
            argument="--sms",
        )
    if args.kernel:
        return planning.param_grid_requests(args.kernel, args.param, arch)
    if args.requests:
        requests = planning.read_requests(args.requests)
        return planning.retarget(requests, args.arch) if args.arch else requests
    notes: list[str] = []
    if args.checkpoint:
        from mlpjit.checkpoint import checkpoint_ue8m0

        if args.ue8m0 is None:
            args.ue8m0 = checkpoint_ue8m0(args.checkpoint)
        shapes = planning.checkpoint_shapes(args.checkpoint, args.tp)
    elif args.model:
        shapes, notes = planning.model_shapes(args.model, args.tp, args.layers)
    else:
        if args.intermediate is None:
            raise UsageError("--hidden needs --intermediate", argument="--intermediate")
        shapes = [planning.LayerShape(args.hidden, args.intermediate, "the layer")]
    from mlpjit.scale_rule import resolve_ue8m0

    plan = planning.shard_plan(
        shapes,
        tp=args.tp,
        tokens=args.tokens,
        arch=arch,
        ue8m0=resolve_ue8m0(args.ue8m0),
        limit=args.limit,
        sms=_target_sms(args),
    )
    for note in notes + plan.notes:
        output.note(note)
    return plan.requests
