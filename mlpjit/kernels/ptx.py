"""PTX device helpers for the CuTe DSL kernels: one small function per PTX instruction.

Each helper wraps one instruction (or a register-level pack around it) in LLVM inline
assembly, so a kernel body reads like its list of instructions and ptxas sees exactly the
modifiers we chose (L2 cache hints, .nc, satfinite, .rn).

Addresses are plain integers: global addresses are Int64 ("l"), shared-memory addresses
are 32-bit offsets in the shared window (Int32, "r"), as CUTLASS does for cp.async.
Word values (packed FP8 / BF16 bytes) travel as Int32.

This module imports cutlass at module level: it is only imported by kernel modules, and
those only inside compile functions (a cache miss), never by `import mlpjit`.
"""

from __future__ import annotations

from cutlass import Float32, Int16, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = [
    "globaltimer",
    "st_global_u64",
    "atom_add_acq_rel_gpu",
    "bar_sync",
    "cp_async_bulk_g2s",
    "cp_async_ca_4",
    "fence_acq_rel_gpu",
    "fence_mbarrier_init",
    "ld_acquire_gpu_u32",
    "ld_relaxed_gpu_v4",
    "ld_relaxed_gpu_v4_f32",
    "red_add_release_gpu",
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_init",
    "mbarrier_init_expect_tx_if_zero",
    "mbarrier_wait",
    "st_global_v4_f32",
    "st_relaxed_gpu_u32",
    "absmax_bf16x2",
    "bf16x2_to_f32x2",
    "bf16_round",
    "cluster_arrive_relaxed",
    "cluster_arrive_release",
    "cluster_ctarank",
    "cluster_sync_acq_rel",
    "cluster_wait",
    "cp_async_cg_16",
    "cp_async_cg_16_if",
    "createpolicy_evict_first",
    "cvt_bf16",
    "cvt_e4m3x4",
    "ex2_approx",
    "f32_as_i32",
    "fabs",
    "fma_rn",
    "fmax",
    "fmin",
    "fresh_ctaid_x",
    "fresh_tid_x",
    "i32_as_f32",
    "ld_global_nc_f32",
    "ld_global_nc_v2_f32",
    "ld_global_nc_v4_f32",
    "ld_global_nc_v4_hint",
    "ld_global_nc_v4_hint_if",
    "ld_global_v4",
    "ld_shared_f32",
    "ld_shared_v4",
    "ld_shared_v4_f32",
    "ld_volatile_shared_u32",
    "mapa_shared",
    "mma_m16n8k32_e4m3",
    "mul_bf16x2",
    "prmt",
    "rcp_approx",
    "rint",
    "st_global_b16",
    "st_cluster_f32",
    "st_cluster_v4",
    "st_cluster_v4_f32",
    "st_async_f32",
    "st_async_v4",
    "st_async_v4_f32",
    "st_shared_f32",
    "st_shared_v4",
    "st_shared_v4_f32",
    "st_volatile_shared_u32",
    "trap_unless_cluster_size",
]

_I32 = "i32"
_F32 = "f32"
_I64 = "i64"
_I16 = "i16"


def _mlir_type(kind: str):
    return {_I32: T.i32(), _F32: T.f32(), _I64: T.i64(), _I16: T.i16()}[kind]


def _wrap(kind: str, value):
    return {_I32: Int32, _F32: Float32, _I64: Int64, _I16: Int16}[kind](value)


def _ir(kind: str, value, loc, ip):
    return _wrap(kind, value).ir_value(loc=loc, ip=ip)


def _asm(
    outs: list[str],
    ins: list[tuple[str, object]],
    code: str,
    constraints: str,
    *,
    side_effects: bool,
    loc=None,
    ip=None,
):
    """Emit one llvm.inline_asm; returns None, one value, or a tuple of values."""
    operands = [_ir(kind, value, loc, ip) for kind, value in ins]
    if not outs:
        res_type = None
    elif len(outs) == 1:
        res_type = _mlir_type(outs[0])
    else:
        res_type = llvm.StructType.get_literal([_mlir_type(o) for o in outs])
    result = llvm.inline_asm(
        res_type,
        operands,
        code,
        constraints,
        has_side_effects=side_effects,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
    if not outs:
        return None
    if len(outs) == 1:
        return _wrap(outs[0], result)
    return tuple(
        _wrap(kind, llvm.extractvalue(_mlir_type(kind), result, [i], loc=loc, ip=ip))
        for i, kind in enumerate(outs)
    )


# ---------------------------------------------------------------- special registers


@dsl_user_op
def fresh_tid_x(*, loc=None, ip=None) -> Int32:
    """mov.u32 r, %tid.x; (volatile: re-read late instead of holding it in a register)"""
    return _asm([_I32], [], "mov.u32 $0, %tid.x;", "=r", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def fresh_ctaid_x(*, loc=None, ip=None) -> Int32:
    """mov.u32 r, %ctaid.x; (volatile: re-read late instead of holding it in a register)"""
    return _asm([_I32], [], "mov.u32 $0, %ctaid.x;", "=r", side_effects=True, loc=loc, ip=ip)


# ---------------------------------------------------------------- memory: global


@dsl_user_op
def createpolicy_evict_first(*, loc=None, ip=None) -> Int64:
    """createpolicy.fractional.L2::evict_first.b64 pol, 1.0;"""
    return _asm(
        [_I64],
        [],
        "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;",
        "=l",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_global_nc_v4_hint(addr: Int64, policy: Int64, *, loc=None, ip=None) -> tuple:
    """ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {r0..r3}, [addr], pol;

    Marked side-effecting so the weight loads stay where the kernel issues them (before
    griddepcontrol.wait) instead of being sunk next to their first use.
    """
    return _asm(
        [_I32] * 4,
        [(_I64, addr), (_I64, policy)],
        "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], $5;",
        "=r,=r,=r,=r,l,l",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_global_nc_v4_hint_if(addr: Int64, policy: Int64, pred: Int32, *, loc=None, ip=None) -> tuple:
    """@p ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {r0..r3}, [addr], pol; (p: pred != 0)

    The persistent kernel's refill of the next row tile: off past the CTA's last tile (the
    registers are then left undefined and never read).
    """
    return _asm(
        [_I32] * 4,
        [(_I64, addr), (_I64, policy), (_I32, pred)],
        "{\n.reg .pred p;\nsetp.ne.b32 p, $6, 0;\n"
        "@p ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], $5;\n}",
        "=r,=r,=r,=r,l,l,r",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_global_nc_v4_f32(addr: Int64, *, loc=None, ip=None) -> tuple:
    """ld.global.nc.v4.f32 {f0..f3}, [addr]; (read-only data such as weight scales)."""
    return _asm(
        [_F32] * 4,
        [(_I64, addr)],
        "ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];",
        "=f,=f,=f,=f,l",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_global_nc_v2_f32(addr: Int64, *, loc=None, ip=None) -> tuple:
    """ld.global.nc.v2.f32 {f0, f1}, [addr]; (read-only data such as weight scales)."""
    return _asm(
        [_F32] * 2,
        [(_I64, addr)],
        "ld.global.nc.v2.f32 {$0, $1}, [$2];",
        "=f,=f,l",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_global_nc_f32(addr: Int64, *, loc=None, ip=None) -> Float32:
    """ld.global.nc.f32 f, [addr]; (read-only data such as weight scales)."""
    return _asm(
        [_F32],
        [(_I64, addr)],
        "ld.global.nc.f32 $0, [$1];",
        "=f,l",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_global_v4(addr: Int64, *, loc=None, ip=None) -> tuple:
    """ld.global.v4.u32 {r0..r3}, [addr]; (coherent: data written by the previous kernel)."""
    return _asm(
        [_I32] * 4,
        [(_I64, addr)],
        "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_global_b16(addr: Int64, value: Int16, *, loc=None, ip=None) -> None:
    """st.global.b16 [addr], h;"""
    _asm(
        [],
        [(_I64, addr), (_I16, value)],
        "st.global.b16 [$0], $1;",
        "l,h,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cp_async_cg_16(smem: Int32, gmem: Int64, *, loc=None, ip=None) -> None:
    """cp.async.cg.shared.global [smem], [gmem], 16;

    Deliberately without .L2::cache_hint: with ptxas 13.0 for sm_90a the hinted form
    (LDGSTS with a cache-policy descriptor) raised CUDA_ERROR_ILLEGAL_INSTRUCTION on the
    H200 (2026-11-29 bisect: the same kernel with only this hint removed ran correctly).
    """
    _asm(
        [],
        [(_I32, smem), (_I64, gmem)],
        "cp.async.cg.shared.global [$0], [$1], 16;",
        "r,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cp_async_cg_16_if(smem: Int32, gmem: Int64, pred: Int32, *, loc=None, ip=None) -> None:
    """@p cp.async.cg.shared.global [smem], [gmem], 16; (p: pred != 0; no hint, as above)"""
    _asm(
        [],
        [(_I32, smem), (_I64, gmem), (_I32, pred)],
        "{\n.reg .pred p;\nsetp.ne.b32 p, $2, 0;\n@p cp.async.cg.shared.global [$0], [$1], 16;\n}",
        "r,l,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )



# ---------------------------------------------------------------- memory: shared


@dsl_user_op
def ld_shared_v4(addr: Int32, *, loc=None, ip=None) -> tuple:
    """ld.shared.v4.u32 {r0..r3}, [addr];"""
    return _asm(
        [_I32] * 4,
        [(_I32, addr)],
        "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_shared_v4_f32(addr: Int32, *, loc=None, ip=None) -> tuple:
    """ld.shared.v4.f32 {f0..f3}, [addr];"""
    return _asm(
        [_F32] * 4,
        [(_I32, addr)],
        "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];",
        "=f,=f,=f,=f,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_shared_f32(addr: Int32, *, loc=None, ip=None) -> Float32:
    """ld.shared.f32 f, [addr];"""
    return _asm(
        [_F32],
        [(_I32, addr)],
        "ld.shared.f32 $0, [$1];",
        "=f,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_shared_v4(addr: Int32, a: Int32, b: Int32, c: Int32, d: Int32, *, loc=None, ip=None):
    """st.shared.v4.u32 [addr], {a, b, c, d};"""
    _asm(
        [],
        [(_I32, addr), (_I32, a), (_I32, b), (_I32, c), (_I32, d)],
        "st.shared.v4.u32 [$0], {$1, $2, $3, $4};",
        "r,r,r,r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_shared_v4_f32(
    addr: Int32, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None
):
    """st.shared.v4.f32 [addr], {a, b, c, d};"""
    _asm(
        [],
        [(_I32, addr), (_F32, a), (_F32, b), (_F32, c), (_F32, d)],
        "st.shared.v4.f32 [$0], {$1, $2, $3, $4};",
        "r,f,f,f,f,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_shared_f32(addr: Int32, value: Float32, *, loc=None, ip=None) -> None:
    """st.shared.f32 [addr], f;"""
    _asm(
        [],
        [(_I32, addr), (_F32, value)],
        "st.shared.f32 [$0], $1;",
        "r,f,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )



@dsl_user_op
def ld_volatile_shared_u32(addr: Int32, *, loc=None, ip=None) -> Int32:
    """ld.volatile.shared.u32 r, [addr]; (re-read every time: a flag another warp sets)"""
    return _asm(
        [_I32],
        [(_I32, addr)],
        "ld.volatile.shared.u32 $0, [$1];",
        "=r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_volatile_shared_u32(addr: Int32, value: Int32, *, loc=None, ip=None) -> None:
    """st.volatile.shared.u32 [addr], value;"""
    _asm(
        [],
        [(_I32, addr), (_I32, value)],
        "st.volatile.shared.u32 [$0], $1;",
        "r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )

# ---------------------------------------------------------------- thread block clusters
# A cluster's CTAs write into each other's shared memory (DSMEM). barrier.cluster counts
# every thread of every CTA in the cluster; .aligned: all threads of a warp execute it.


@dsl_user_op
def cluster_ctarank(*, loc=None, ip=None) -> Int32:
    """mov.u32 r, %cluster_ctarank;"""
    return _asm(
        [_I32], [], "mov.u32 $0, %cluster_ctarank;", "=r", side_effects=False, loc=loc, ip=ip
    )


@dsl_user_op
def trap_unless_cluster_size(size: int, *, loc=None, ip=None) -> None:
    """Trap unless the launch made clusters of ``size`` CTAs (%cluster_nctarank): a launch
    without the cluster attribute must fail, not run every CTA as rank 0 of its own."""
    _asm(
        [],
        [],
        "{\n\t.reg .u32 n;\n\t.reg .pred bad;\n\tmov.u32 n, %cluster_nctarank;\n\t"
        f"setp.ne.u32 bad, n, {int(size)};\n\t@bad trap;\n\t}}",
        "~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cluster_arrive_relaxed(*, loc=None, ip=None) -> None:
    """barrier.cluster.arrive.relaxed.aligned; (no memory ordering: "this CTA has started")"""
    _asm(
        [],
        [],
        "barrier.cluster.arrive.relaxed.aligned;",
        "~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cluster_arrive_release(*, loc=None, ip=None) -> None:
    """barrier.cluster.arrive.release.aligned; (this CTA's earlier memory accesses happen
    before the barrier completes)"""
    _asm(
        [],
        [],
        "barrier.cluster.arrive.release.aligned;",
        "~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cluster_wait(*, loc=None, ip=None) -> None:
    """barrier.cluster.wait.aligned; (acquire at cluster scope)"""
    _asm([], [], "barrier.cluster.wait.aligned;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def cluster_sync_acq_rel(*, loc=None, ip=None) -> None:
    """barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"""
    _asm(
        [],
        [],
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;",
        "~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mapa_shared(addr: Int32, rank: Int32, *, loc=None, ip=None) -> Int32:
    """mapa.shared::cluster.u32 r, addr, rank; (this CTA's smem offset -> rank's, cluster window)"""
    return _asm(
        [_I32],
        [(_I32, addr), (_I32, rank)],
        "mapa.shared::cluster.u32 $0, $1, $2;",
        "=r,r,r",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_cluster_v4(addr: Int32, a: Int32, b: Int32, c: Int32, d: Int32, *, loc=None, ip=None):
    """st.shared::cluster.v4.u32 [addr], {a, b, c, d}; (addr from mapa_shared)"""
    _asm(
        [],
        [(_I32, addr), (_I32, a), (_I32, b), (_I32, c), (_I32, d)],
        "st.shared::cluster.v4.u32 [$0], {$1, $2, $3, $4};",
        "r,r,r,r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_cluster_v4_f32(
    addr: Int32, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None
) -> None:
    """st.shared::cluster.v4.f32 [addr], {a, b, c, d}; (addr from mapa_shared)"""
    _asm(
        [],
        [(_I32, addr), (_F32, a), (_F32, b), (_F32, c), (_F32, d)],
        "st.shared::cluster.v4.f32 [$0], {$1, $2, $3, $4};",
        "r,f,f,f,f,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_cluster_f32(addr: Int32, value: Float32, *, loc=None, ip=None) -> None:
    """st.shared::cluster.f32 [addr], f; (addr from mapa_shared)"""
    _asm(
        [],
        [(_I32, addr), (_F32, value)],
        "st.shared::cluster.f32 [$0], $1;",
        "r,f,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_async_v4(
    addr: Int32, a: Int32, b: Int32, c: Int32, d: Int32, mbar: Int32, *, loc=None, ip=None
) -> None:
    """st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [addr], {a, b, c, d}, [mbar];

    st_async_v4_f32's form for packed words (the FP8 values of a quantized chunk)."""
    _asm(
        [],
        [(_I32, addr), (_I32, a), (_I32, b), (_I32, c), (_I32, d), (_I32, mbar)],
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 "
        "[$0], {$1, $2, $3, $4}, [$5];",
        "r,r,r,r,r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_async_f32(addr: Int32, value: Float32, mbar: Int32, *, loc=None, ip=None) -> None:
    """st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [addr], value, [mbar];"""
    _asm(
        [],
        [(_I32, addr), (_F32, value), (_I32, mbar)],
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [$0], $1, [$2];",
        "r,f,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_async_v4_f32(
    addr: Int32, a: Float32, b: Float32, c: Float32, d: Float32, mbar: Int32, *, loc=None, ip=None
) -> None:
    """st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [addr], {a, b, c, d}, [mbar];

    The 16 bytes land in another CTA's shared memory and count on its mbarrier (``addr`` and
    ``mbar`` from mapa_shared): the receiver's wait on that mbarrier orders them, so neither
    side needs a release fence (a cluster barrier's release is a MEMBAR.ALL.GPU)."""
    _asm(
        [],
        [(_I32, addr), (_F32, a), (_F32, b), (_F32, c), (_F32, d), (_I32, mbar)],
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 "
        "[$0], {$1, $2, $3, $4}, [$5];",
        "r,f,f,f,f,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


# ---------------------------------------------------------------- tensor core


@dsl_user_op
def mma_m16n8k32_e4m3(a: tuple, b: tuple, c: tuple, *, loc=None, ip=None) -> tuple:
    """mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {d0..d3}, {a0..a3}, {b0,b1}, {c0..c3};"""
    ins = [(_I32, v) for v in a] + [(_I32, v) for v in b] + [(_F32, v) for v in c]
    return _asm(
        [_F32] * 4,
        ins,
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def wgmma_k32_e4m3(
    a: tuple | Int64, b_desc: Int64, c: tuple, accumulate: bool, *, loc=None, ip=None
) -> tuple:
    """wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3 {d..}, a, b_desc, p;
    with N = 2 len(c) (8, 16 or 32): the warpgroup's 64 x N product of A and B (K-major, by
    a shared-memory descriptor); A is four registers (a tuple: this warp's 16 rows in
    mma.sync's m16n8k32 fragment) or a shared-memory descriptor too (an Int64).
    ``accumulate`` False ignores c. Issue between wgmma_fence and wgmma_commit; the result
    is valid after wgmma_wait."""
    outs = len(c)
    if outs not in (4, 8, 16):
        raise ValueError(f"wgmma_k32_e4m3 takes 4, 8 or 16 accumulators (N 8-32), got {outs}")
    a_regs = isinstance(a, tuple)
    a_ins = [(_I32, v) for v in a] if a_regs else [(_I64, a)]
    ins = a_ins + [(_I64, b_desc)] + [(_F32, v) for v in c]
    scale_d = 1 if accumulate else 0
    d = ", ".join(f"${i}" for i in range(outs))
    a_operand = "{" + ", ".join(f"${outs + i}" for i in range(4)) + "}" if a_regs else f"${outs}"
    a_constraints = ["r"] * 4 if a_regs else ["l"]
    return _asm(
        [_F32] * outs,
        ins,
        "{\n.reg .pred p;\n"
        f"setp.ne.b32 p, {scale_d}, 0;\n"
        f"wgmma.mma_async.sync.aligned.m64n{2 * outs}k32.f32.e4m3.e4m3 "
        f"{{{d}}}, {a_operand}, ${outs + len(a_ins)}, p, 1, 1;\n}}",
        ",".join(["=f"] * outs + a_constraints + ["l"] + [str(i) for i in range(outs)]),
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def wgmma_fence(*, loc=None, ip=None) -> None:
    """wgmma.fence.sync.aligned; (registers and shared memory ready for the next wgmma)."""
    _asm([], [], "wgmma.fence.sync.aligned;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def wgmma_commit(*, loc=None, ip=None) -> None:
    """wgmma.commit_group.sync.aligned; (the wgmmas issued so far form one group)."""
    _asm(
        [], [], "wgmma.commit_group.sync.aligned;", "~{memory}", side_effects=True, loc=loc,
        ip=ip,
    )  # fmt: skip


@dsl_user_op
def wgmma_wait(*, loc=None, ip=None) -> None:
    """wgmma.wait_group.sync.aligned 0; (every committed group done)."""
    _asm(
        [], [], "wgmma.wait_group.sync.aligned 0;", "~{memory}", side_effects=True, loc=loc,
        ip=ip,
    )  # fmt: skip


@dsl_user_op
def fence_proxy_async_shared(*, loc=None, ip=None) -> None:
    """fence.proxy.async.shared::cta; (generic-proxy shared stores visible to wgmma/TMA)."""
    _asm(
        [], [], "fence.proxy.async.shared::cta;", "~{memory}", side_effects=True, loc=loc,
        ip=ip,
    )  # fmt: skip


# ---------------------------------------------------------------- conversions


@dsl_user_op
def cvt_e4m3x4(x0: Float32, x1: Float32, x2: Float32, x3: Float32, *, loc=None, ip=None) -> Int32:
    """cvt.rn.satfinite.e4m3x2.f32 (twice), packed so x0 is the lowest byte of the word."""
    return _asm(
        [_I32],
        [(_F32, x0), (_F32, x1), (_F32, x2), (_F32, x3)],
        "{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 $0, {lo, hi};\n}",
        "=r,f,f,f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cvt_bf16(x: Float32, *, loc=None, ip=None) -> Int16:
    """cvt.rn.bf16.f32 h, f; (the BF16 bits of x, round to nearest even)."""
    return _asm(
        [_I16],
        [(_F32, x)],
        "cvt.rn.bf16.f32 $0, $1;",
        "=h,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def bf16_round(x: Float32, *, loc=None, ip=None) -> Float32:
    """cvt.rn.bf16.f32 then cvt.f32.bf16: x rounded to the nearest BF16, as float32."""
    return _asm(
        [_F32],
        [(_F32, x)],
        "{\n.reg .b16 h;\ncvt.rn.bf16.f32 h, $1;\ncvt.f32.bf16 $0, h;\n}",
        "=f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def bf16x2_to_f32x2(word: Int32, *, loc=None, ip=None) -> tuple:
    """shl.b32 / and.b32: the two BF16 halves of a word (low half first) as float32 (exact)."""
    return _asm(
        [_F32, _F32],
        [(_I32, word)],
        "shl.b32 $0, $2, 16;\nand.b32 $1, $2, 0xffff0000;",
        "=f,=f,r",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def f32_as_i32(x: Float32, *, loc=None, ip=None) -> Int32:
    """mov.b32 r, f; (bit pattern)"""
    return _asm([_I32], [(_F32, x)], "mov.b32 $0, $1;", "=r,f", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def i32_as_f32(x: Int32, *, loc=None, ip=None) -> Float32:
    """mov.b32 f, r; (bit pattern)"""
    return _asm([_F32], [(_I32, x)], "mov.b32 $0, $1;", "=f,r", side_effects=False, loc=loc, ip=ip)


# ---------------------------------------------------------------- float arithmetic


@dsl_user_op
def rcp_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """rcp.approx.ftz.f32 d, x; (MUFU.RCP, within 1 ulp)"""
    return _asm(
        [_F32],
        [(_F32, x)],
        "rcp.approx.ftz.f32 $0, $1;",
        "=f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def fma_rn(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """fma.rn.f32 d, a, b, c;"""
    return _asm(
        [_F32],
        [(_F32, a), (_F32, b), (_F32, c)],
        "fma.rn.f32 $0, $1, $2, $3;",
        "=f,f,f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ex2_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """ex2.approx.ftz.f32 d, x;"""
    return _asm(
        [_F32],
        [(_F32, x)],
        "ex2.approx.ftz.f32 $0, $1;",
        "=f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def rint(x: Float32, *, loc=None, ip=None) -> Float32:
    """cvt.rni.f32.f32 d, x; (round to nearest integer, ties to even)"""
    return _asm(
        [_F32], [(_F32, x)], "cvt.rni.f32.f32 $0, $1;", "=f,f", side_effects=False, loc=loc, ip=ip
    )


@dsl_user_op
def fabs(x: Float32, *, loc=None, ip=None) -> Float32:
    """abs.f32 d, x;"""
    return _asm([_F32], [(_F32, x)], "abs.f32 $0, $1;", "=f,f", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def fmax(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """max.f32 d, a, b;"""
    return _asm(
        [_F32],
        [(_F32, a), (_F32, b)],
        "max.f32 $0, $1, $2;",
        "=f,f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def fmin(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """min.f32 d, a, b;"""
    return _asm(
        [_F32],
        [(_F32, a), (_F32, b)],
        "min.f32 $0, $1, $2;",
        "=f,f,f",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


# ---------------------------------------------------------------- packed BF16 (two per word)


@dsl_user_op
def absmax_bf16x2(a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """max.xorsign.abs.bf16x2 d, a, b; (per half: max(|a|, |b|), sign = sign(a) ^ sign(b))"""
    return _asm(
        [_I32],
        [(_I32, a), (_I32, b)],
        "max.xorsign.abs.bf16x2 $0, $1, $2;",
        "=r,r,r",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mul_bf16x2(a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """mul.rn.bf16x2 d, a, b; (sm_90)"""
    return _asm(
        [_I32],
        [(_I32, a), (_I32, b)],
        "mul.rn.bf16x2 $0, $1, $2;",
        "=r,r,r",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def prmt(a: Int32, b: Int32, selector: int, *, loc=None, ip=None) -> Int32:
    """prmt.b32 d, a, b, selector; (byte permute; selector is a constant)"""
    return _asm(
        [_I32],
        [(_I32, a), (_I32, b)],
        f"prmt.b32 $0, $1, $2, {selector:#x};",
        "=r,r,r",
        side_effects=False,
        loc=loc,
        ip=ip,
    )


# ---------------------------------------------------------------- mbarriers and bulk copies
# A ring of shared-memory stages: the producer's bulk copies complete a stage's "full"
# mbarrier by their byte count; the consumers' arrivals complete its "empty" one.


@dsl_user_op
def mbarrier_init(addr: Int32, count: int, *, loc=None, ip=None) -> None:
    """mbarrier.init.shared::cta.b64 [addr], count;"""
    _asm(
        [],
        [(_I32, addr)],
        f"mbarrier.init.shared::cta.b64 [$0], {int(count)};",
        "r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbarrier_init_expect_tx_if_zero(
    addr: Int32, selector: Int32, nbytes: int | Int32, *, loc=None, ip=None
) -> None:
    """Where ``selector`` is 0: init the mbarrier at addr for one arrival, fence the init
    for the cluster, and arrive expecting ``nbytes`` transaction bytes (a constant, or a
    register where it differs between CTAs). Predicated in one asm block, with no branch:
    a branch among the pre-wait weight loads let ptxas sink some of them below
    griddepcontrol.wait."""
    ins = [(_I32, addr), (_I32, selector)]
    if isinstance(nbytes, int):
        count, constraints = str(int(nbytes)), "r,r,~{memory}"
    else:
        ins.append((_I32, nbytes))
        count, constraints = "$2", "r,r,r,~{memory}"
    _asm(
        [],
        ins,
        "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, $1, 0;\n\t"
        "@p mbarrier.init.shared::cta.b64 [$0], 1;\n\t"
        "@p fence.mbarrier_init.release.cluster;\n\t"
        f"@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {count};\n\t}}",
        constraints,
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def fence_mbarrier_init(*, loc=None, ip=None) -> None:
    """fence.mbarrier_init.release.cluster; fence.proxy.async.shared::cta; (initialized
    barriers visible to the bulk-copy unit before any copy signals them)"""
    _asm(
        [],
        [],
        "fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;",
        "~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbarrier_arrive_expect_tx(addr: Int32, nbytes: Int32, *, loc=None, ip=None) -> None:
    """mbarrier.arrive.expect_tx.shared::cta.b64 _, [addr], nbytes;"""
    _asm(
        [],
        [(_I32, addr), (_I32, nbytes)],
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
        "r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbarrier_arrive(addr: Int32, *, loc=None, ip=None) -> None:
    """mbarrier.arrive.shared::cta.b64 _, [addr]; (release: our reads of the stage are done)"""
    _asm(
        [],
        [(_I32, addr)],
        "mbarrier.arrive.shared::cta.b64 _, [$0];",
        "r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mbarrier_wait(addr: Int32, parity: Int32, *, loc=None, ip=None) -> None:
    """Spin on mbarrier.try_wait.parity.shared::cta.b64 until the phase of ``parity`` is done."""
    _asm(
        [],
        [(_I32, addr), (_I32, parity)],
        "{\n\t.reg .pred done;\n\tWAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n\t"
        "@!done bra WAIT;\n\t}",
        "r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cp_async_bulk_g2s(
    smem: Int32, gmem: Int64, nbytes: Int32, mbar: Int32, *, loc=None, ip=None
) -> None:
    """cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [s], [g], n, [mbar];

    One thread copies n bytes (a multiple of 16, both addresses 16-byte aligned); the
    mbarrier's transaction count falls by n when they have landed."""
    _asm(
        [],
        [(_I32, smem), (_I64, gmem), (_I32, nbytes), (_I32, mbar)],
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
        "r,l,r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cp_async_bulk_tensor_3d_g2s(
    smem: Int32, tensor_map: Int64, c0: Int32, c1: Int32, c2: Int32, mbar: Int32, *, loc=None,
    ip=None,
) -> None:  # fmt: skip
    """cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    [s], [map, {c0, c1, c2}], [mbar];

    One thread copies the box of the tensor map (a 64-byte aligned map in global memory) at
    coordinates (c0, c1, c2), innermost first, into shared memory (1 KB aligned for the
    128-byte swizzle); the mbarrier's transaction count falls by the box's bytes."""
    _asm(
        [],
        [(_I32, smem), (_I64, tensor_map), (_I32, c0), (_I32, c1), (_I32, c2), (_I32, mbar)],
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[$0], [$1, {$2, $3, $4}], [$5];",
        "r,l,r,r,r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def cp_async_ca_4(smem: Int32, gmem: Int64, *, loc=None, ip=None) -> None:
    """cp.async.ca.shared.global [smem], [gmem], 4;"""
    _asm(
        [],
        [(_I32, smem), (_I64, gmem)],
        "cp.async.ca.shared.global [$0], [$1], 4;",
        "r,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def bar_sync(barrier: int, threads: int, *, loc=None, ip=None) -> None:
    """bar.sync id, threads; (a named barrier for a subset of the CTA's warps)"""
    _asm(
        [],
        [],
        f"bar.sync {int(barrier)}, {int(threads)};",
        "~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


# ---------------------------------------------------------------- split partials in global memory


@dsl_user_op
def st_global_v4_f32(
    addr: Int64, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None
) -> None:
    """st.global.v4.f32 [addr], {a, b, c, d};"""
    _asm(
        [],
        [(_I64, addr), (_F32, a), (_F32, b), (_F32, c), (_F32, d)],
        "st.global.v4.f32 [$0], {$1, $2, $3, $4};",
        "l,f,f,f,f,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_relaxed_gpu_v4_f32(addr: Int64, *, loc=None, ip=None) -> tuple:
    """ld.relaxed.gpu.global.v4.f32 {f0..f3}, [addr]; (another CTA's data: not from L1)"""
    return _asm(
        [_F32] * 4,
        [(_I64, addr)],
        "ld.relaxed.gpu.global.v4.f32 {$0, $1, $2, $3}, [$4];",
        "=f,=f,=f,=f,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_relaxed_gpu_v4(addr: Int64, *, loc=None, ip=None) -> tuple:
    """ld.relaxed.gpu.global.v4.u32 {r0..r3}, [addr]; (written in this launch: not from L1)"""
    return _asm(
        [_I32] * 4,
        [(_I64, addr)],
        "ld.relaxed.gpu.global.v4.u32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def ld_acquire_gpu_u32(addr: Int64, *, loc=None, ip=None) -> Int32:
    """ld.acquire.gpu.global.u32 r, [addr];"""
    return _asm(
        [_I32],
        [(_I64, addr)],
        "ld.acquire.gpu.global.u32 $0, [$1];",
        "=r,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def red_add_release_gpu(addr: Int64, value: Int32, *, loc=None, ip=None) -> None:
    """red.release.gpu.global.add.u32 [addr], value;"""
    _asm(
        [],
        [(_I64, addr), (_I32, value)],
        "red.release.gpu.global.add.u32 [$0], $1;",
        "l,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None) -> None:
    """fence.acq_rel.gpu;"""
    _asm([], [], "fence.acq_rel.gpu;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def atom_add_acq_rel_gpu(addr: Int64, value: Int32, *, loc=None, ip=None) -> Int32:
    """atom.acq_rel.gpu.global.add.u32 old, [addr], value;"""
    return _asm(
        [_I32],
        [(_I64, addr), (_I32, value)],
        "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;",
        "=r,l,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_relaxed_gpu_u32(addr: Int64, value: Int32, *, loc=None, ip=None) -> None:
    """st.relaxed.gpu.global.u32 [addr], value;"""
    _asm(
        [],
        [(_I64, addr), (_I32, value)],
        "st.relaxed.gpu.global.u32 [$0], $1;",
        "l,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


# ---------------------------------------------------------------- tracing (developer aid)


@dsl_user_op
def globaltimer(*, loc=None, ip=None) -> Int64:
    """mov.u64 t, %globaltimer; (nanoseconds, GPU-wide)"""
    return _asm([_I64], [], "mov.u64 $0, %globaltimer;", "=l", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def smid(*, loc=None, ip=None) -> Int32:
    """mov.u32 id, %smid; (the SM this thread runs on)"""
    return _asm([_I32], [], "mov.u32 $0, %smid;", "=r", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def st_global_u64(addr: Int64, value: Int64, *, loc=None, ip=None) -> None:
    """st.global.u64 [addr], value;"""
    _asm(
        [],
        [(_I64, addr), (_I64, value)],
        "st.global.u64 [$0], $1;",
        "l,l,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )
