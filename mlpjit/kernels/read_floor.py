"""A kernel that only reads: what streaming N bytes from HBM costs one kernel, with nothing
else in its way.

It streams its buffer the way fp8_stream streams weights (a producer warp's bulk copies
into a ring of shared-memory stages guarded by mbarriers, from launch on; consumer warps
wait for the previous kernel, read each stage out of shared memory and release it), but
computes nothing: each consumer thread XORs the 16-byte words it read and writes that one
word. Timed in the same PDL chains as the layers (mlpjit.bench.read_floor), it says how
close to the copy-bandwidth floor a kernel of a given size can get on this machine, and
which stage shapes stream fastest: the part of a layer's time that no kernel of this
design can remove.

Compile parameters (ReadParams): the bytes, their layout as rows (a weight matrix's rows of
``row_bytes``), and the ring: a stage is ``copies`` bulk copies of ``copy_bytes`` each, one
per row at the row stride (as fp8_stream copies a 16-row tile's K chunk), or one copy of
consecutive bytes (``copies`` 1 and ``copy_bytes`` = ``row_bytes``). Stages go to the CTAs
in equal contiguous ranges, in tile-major order.

A second phase (``then_nbytes`` more bytes right after the first, in rows of
``then_row_bytes`` read ``then_copy_bytes`` at a time) makes it a one-kernel layer: the
producer streams its first-phase range, then its second, without pausing; with ``barrier``
the consumers wait, between the phases, until every CTA's consumers are done with the first
(an arrival count in global memory, as a layer's down waits for all of act), which the
producer never waits for.

With ``dynamic`` N (one phase only) the CTAs share the stages out as they go instead of
in fixed ranges: each CTA's producer requests its N first stages from launch on (a fixed
range of the first N x ctas stages), then, after the PDL wait, claims the next stage from
an atomic counter in ``out`` whenever it has a slot to fill, so an SM that streams faster
reads more. It measures what dynamic work assignment can gain over an equal static split
when nothing else differs between the SMs. The counter only grows: a launch claims exactly
``dynamic_claims`` times (every stage past the fixed ranges, then one refused claim per
CTA), so a claim's value modulo that count is its stage, and launches one after another
need no reset (they must not overlap: claims start after the PDL wait).

With ``tensor`` a stage is one TMA tensor copy instead (the same rows and bytes: a box of
128 bytes x ``copies`` rows x ``copy_bytes`` / 128 K blocks through the map of
mlpjit.kernels.tensor_map.weight_block_map, landing with the 128-byte swizzle that wgmma
reads A in): whether the copies a descriptor-fed wgmma needs stream as fast as row copies.

Kernel parameters: ``out`` (int32 [out_words]: each consumer thread's XOR, then the
barrier's arrival count, which only ever grows: no reset between launches; with
``dynamic``, then a pad word and the 64-bit claim counter, zero before the first launch), ``buf``
(the bytes; 16-byte aligned) and, with ``tensor``, ``map`` (the buffer's tensor map, as
rows of ``row_bytes``).

Nothing here is imported by ``import mlpjit``; mlpjit.bench.read_floor imports it to
register the kernel.
"""

# No `from __future__ import annotations`: CuTe DSL evaluates the kernel's annotations.
from dataclasses import dataclass
from typing import Any

from mlpjit.jit.binary import KernelBinary, KernelParam
from mlpjit.jit.spec import KernelSpec, register
from mlpjit.kernels import hopper
from mlpjit.kernels.tensor_map import MAP_BYTES

__all__ = ["PARAMS", "SPEC", "ReadParams", "compile_cubin"]

PARAMS = (KernelParam("out", "ptr"), KernelParam("buf", "ptr"))
TENSOR_PARAMS = (*PARAMS, KernelParam("map", "ptr"))
MAX_BYTES = 1 << 31
MAX_COPY = 1 << 16
MAX_COPIES = 32
MAX_WARPS = 16
_BARRIERS = 1024  # the mbarriers' bytes at the start of shared memory (ring is 1 KB aligned)
_DYNAMIC_STAGES_MAX = 48  # dynamic: each slot's stage number also fits in the first 1 KB
_END = -1  # dynamic: the stage number of the slot that ends the consumers' loop


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(
            f"read_floor param {name} must be an int in [{low}, {high}], got {value!r}"
        )
    return value


@dataclass(frozen=True)
class ReadParams:
    """nbytes: bytes read (whole tiles of ``copies`` rows); row_bytes: a row's length;
    copy_bytes, copies: one stage (copies rows x copy_bytes); stages: ring depth; warps:
    consumer warps; ctas: the grid (one CTA per SM where it fits)."""

    nbytes: int
    row_bytes: int
    copy_bytes: int
    copies: int
    stages: int
    warps: int = 8
    ctas: int = hopper.SMS
    then_nbytes: int = 0
    then_row_bytes: int = 0
    then_copy_bytes: int = 0
    barrier: bool = False
    tensor: bool = False  # a stage is one TMA tensor copy (128-byte swizzle), not row copies
    dynamic: int = 0  # 0: fixed ranges; N: N fixed stages per CTA, the rest claimed

    def __post_init__(self) -> None:
        _check_int("nbytes", self.nbytes, 16, MAX_BYTES)
        _check_int("copies", self.copies, 1, MAX_COPIES)
        _check_int("stages", self.stages, 1, 64)
        _check_int("warps", self.warps, 1, MAX_WARPS)
        _check_int("ctas", self.ctas, 1, 1 << 16)
        if type(self.barrier) is not bool:
            raise ValueError(f"read_floor param barrier must be a bool, got {self.barrier!r}")
        if type(self.tensor) is not bool:
            raise ValueError(f"read_floor param tensor must be a bool, got {self.tensor!r}")
        if self.tensor and (self.then_nbytes or self.copy_bytes % 128 or self.copies % 8):
            raise ValueError(
                "read_floor param tensor takes one phase of copies of whole swizzle atoms "
                f"(copies a multiple of 8, copy_bytes of 128), got copies={self.copies}, "
                f"copy_bytes="
                f"{self.copy_bytes}, then_nbytes={self.then_nbytes}"
            )
        _check_int("dynamic", self.dynamic, 0, _DYNAMIC_STAGES_MAX)
        if self.dynamic and (self.then_nbytes or self.stages > _DYNAMIC_STAGES_MAX):
            raise ValueError(
                f"read_floor param dynamic takes one phase and at most {_DYNAMIC_STAGES_MAX} "
                f"stages, got then_nbytes={self.then_nbytes}, stages={self.stages}"
            )
        if self.then_nbytes == 0:
            if self.then_row_bytes or self.then_copy_bytes or self.barrier:
                raise ValueError(
                    "read_floor param then_nbytes must be > 0 where then_row_bytes, "
                    "then_copy_bytes or barrier is set"
                )
        else:
            _check_int("then_nbytes", self.then_nbytes, 16, MAX_BYTES - self.nbytes)
        for phase in self.phases:
            self._check_phase(*phase)
        if self.smem_bytes > hopper.SMEM_PER_CTA_MAX - hopper.SMEM_CTA_OVERHEAD:
            raise ValueError(
                f"read_floor param stages: {self.stages} stages of {self.stage_bytes} B do not "
                f"fit a CTA's shared memory"
            )

    def _check_phase(self, prefix: str, nbytes: int, row_bytes: int, copy_bytes: int) -> None:
        _check_int(f"{prefix}row_bytes", row_bytes, 16, MAX_BYTES)
        _check_int(f"{prefix}copy_bytes", copy_bytes, 16, MAX_COPY)
        if copy_bytes % 16 or row_bytes % copy_bytes:
            raise ValueError(
                f"read_floor param {prefix}copy_bytes must be a multiple of 16 that divides "
                f"{prefix}row_bytes ({row_bytes}), got {copy_bytes}"
            )
        tile = self.copies * row_bytes
        if nbytes % tile:
            raise ValueError(
                f"read_floor param {prefix}nbytes must be whole tiles of copies x "
                f"{prefix}row_bytes ({tile} B), got {nbytes}"
            )
        if nbytes // (self.copies * copy_bytes) < self.ctas:
            raise ValueError(
                f"read_floor param ctas must be at most the stages of each phase "
                f"({nbytes // (self.copies * copy_bytes)}), got {self.ctas}"
            )

    @property
    def phases(self) -> list[tuple[str, int, int, int]]:
        """(param prefix, bytes, row bytes, copy bytes) of each phase."""
        phases = [("", self.nbytes, self.row_bytes, self.copy_bytes)]
        if self.then_nbytes:
            phases.append(("then_", self.then_nbytes, self.then_row_bytes, self.then_copy_bytes))
        return phases

    @property
    def total_bytes(self) -> int:
        return self.nbytes + self.then_nbytes

    @property
    def stage_bytes(self) -> int:
        """A ring slot: the larger phase's stage."""
        return self.copies * max(copy for _, _, _, copy in self.phases)

    @property
    def smem_bytes(self) -> int:
        return _BARRIERS + self.stages * self.stage_bytes

    @property
    def threads(self) -> int:
        return 32 * (self.warps + 1)

    @property
    def thread_words(self) -> int:
        """int32 words of ``out`` the consumer threads write (the XOR of what they read)."""
        return self.ctas * self.warps * 32

    @property
    def out_words(self) -> int:
        """int32 words of ``out``: one per consumer thread, the arrival count, and with
        ``dynamic`` a pad word and the claim counter (two words, 8-byte aligned)."""
        return self.thread_words + (4 if self.dynamic else 1)

    @property
    def units(self) -> int:
        """Stages of the first phase."""
        return self.nbytes // (self.copies * self.copy_bytes)

    @property
    def fixed_units(self) -> int:
        """dynamic: the stages dealt in fixed ranges (N per CTA where there are enough)."""
        return min(self.units, self.dynamic * self.ctas)

    @property
    def dynamic_claims(self) -> int:
        """dynamic: the claims one launch makes (every stage past the fixed ranges, then one
        refused claim per CTA): the claim counter's step per launch."""
        return self.units - self.fixed_units + self.ctas

    def claimed_stage(self, value: int) -> int | None:
        """dynamic: the stage a claim that read ``value`` off the counter reads, None where
        the claim is refused (the host twin of the kernel's claimed_stage)."""
        stage = value % self.dynamic_claims + self.fixed_units
        return stage if stage < self.units else None

    def cta_units(self, cta: int, phase: int = 0) -> tuple[int, int]:
        """[u0, u1): the stages of ``phase`` CTA ``cta`` reads (the host twin of the
        kernel's split; with ``dynamic``, its fixed range only)."""
        _, nbytes, _, copy = self.phases[phase]
        units = self.fixed_units if self.dynamic else nbytes // (self.copies * copy)
        return cta * units // self.ctas, (cta + 1) * units // self.ctas

    def unit_offset(self, unit: int, phase: int = 0) -> int:
        """Byte offset of stage ``unit``'s first copy in ``phase``; copy j is a row
        further on."""
        _, _, row_bytes, copy = self.phases[phase]
        tile, chunk = divmod(unit, row_bytes // copy)
        return (self.nbytes if phase else 0) + tile * self.copies * row_bytes + chunk * copy


SPEC = register(
    KernelSpec(
        name="read_floor",
        builder="mlpjit.kernels.read_floor",
        params=ReadParams,
        sources="mlpjit.kernels.read_floor",
        archs=("sm_90a",),
    )
)


def _program(params: ReadParams) -> Any:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64

    from mlpjit.kernels import ptx
    from mlpjit.kernels.cubin import launch_options

    P = params
    W, R, C = P.warps, P.stages, P.ctas
    # Per phase: (byte offset, units, stages per tile, copy bytes, row bytes).
    phases = [
        (0 if i == 0 else P.nbytes, nbytes // (P.copies * copy), row // copy, copy, row)
        for i, (_, nbytes, row, copy) in enumerate(P.phases)
    ]
    count_word = C * W * 32  # out's arrival count

    def full_bar(s_base, i):
        return s_base + 8 * i

    def empty_bar(s_base, i):
        return s_base + 8 * (R + i)

    @cute.jit
    def ring_next(slot, phase):
        slot = slot + 1
        if slot == R:
            slot = Int32(0)
            phase = phase ^ 1
        return slot, phase

    claim_word = count_word + 2  # dynamic: the 64-bit claim counter (8-byte aligned)
    claims = P.dynamic_claims if P.dynamic else 1
    fixed = P.fixed_units

    def unit_word(s_base, i):
        """dynamic: ring slot i's stage number (_END: no more stages)."""
        return s_base + 16 * R + 4 * i

    @cute.kernel
    def kernel(m_out: cute.Tensor, m_buf: cute.Tensor):
        body(m_out, m_buf, Int64(0))

    @cute.kernel
    def tensor_kernel(m_out: cute.Tensor, m_buf: cute.Tensor, m_map: cute.Tensor):
        body(m_out, m_buf, Int64(m_map.iterator.toint()))

    @cute.jit
    def request(
        g_buf: Int64,
        g_map: Int64,
        s_ring,
        s_base,
        u,
        slot,
        phase,
        filled,
        lane,
        i_phase: cutlass.Constexpr,
    ):
        """The producer warp: stage u of the phase into the ring's next slot, once the
        consumers have released it (from the ring's second round on)."""
        base, _, chunks, copy, row = phases[i_phase]
        if filled >= R:
            ptx.mbarrier_wait(empty_bar(s_base, slot), phase ^ 1)
        if lane == 0:
            if cutlass.const_expr(P.dynamic):
                ptx.st_shared_f32(unit_word(s_base, slot), ptx.i32_as_f32(u))
            ptx.mbarrier_arrive_expect_tx(full_bar(s_base, slot), Int32(P.copies * copy))
        cute.arch.sync_warp()
        if cutlass.const_expr(P.tensor):
            if lane == 0:
                tile = u // chunks
                ptx.cp_async_bulk_tensor_3d_g2s(
                    s_ring + slot * P.stage_bytes,
                    g_map,
                    Int32(0),
                    tile * P.copies,
                    (u - tile * chunks) * (copy // 128),
                    full_bar(s_base, slot),
                )
        elif lane < P.copies:
            tile = u // chunks
            src = (
                Int64(base)
                + Int64(tile) * (P.copies * row)
                + Int64(u - tile * chunks) * copy
                + Int64(lane) * row
            )
            ptx.cp_async_bulk_g2s(
                s_ring + slot * P.stage_bytes + lane * copy,
                g_buf + src,
                Int32(copy),
                full_bar(s_base, slot),
            )
        filled = filled + 1
        slot, phase = ring_next(slot, phase)
        return slot, phase, filled

    @cute.jit
    def claim(g_claims: Int64, lane) -> Int64:
        """Lane 0 takes the next claim (relaxed: a claim orders nothing); the others 0."""
        value = Int64(0)
        if lane == 0:
            counter = cute.make_ptr(Int64, g_claims, cute.AddressSpace.gmem, assumed_align=8)
            value = cute.arch.atomic_add(counter, Int64(1), sem="relaxed", scope="gpu")
        return value

    @cute.jit
    def claimed_stage(value: Int64) -> Int32:
        """The stage a claim (lane 0's) names, for every lane: its count modulo the claims
        of one launch, past the fixed ranges; >= units where the claim was refused."""
        return cute.arch.shuffle_sync(Int32(value % claims), 0) + fixed

    @cute.jit
    def body(m_out: cute.Tensor, m_buf: cute.Tensor, g_map: Int64):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = tid >> 5
        lane = tid & 31
        smem = cutlass.memory.SmemAllocator()
        s_base = smem.allocate(P.smem_bytes, byte_alignment=1024).toint()
        s_ring = s_base + _BARRIERS
        if tid == 0:
            for i in cutlass.range_constexpr(R):
                ptx.mbarrier_init(full_bar(s_base, i), 1)
                ptx.mbarrier_init(empty_bar(s_base, i), W)
            ptx.fence_mbarrier_init()
        cute.arch.sync_threads()
        slot = Int32(0)
        phase = Int32(0)
        filled = Int32(0)  # stages requested so far: from R on, slots must be released first
        if warp == W:
            g_buf = Int64(m_buf.iterator.toint())
            for i_phase in cutlass.range_constexpr(len(phases)):
                _, units, _, _, _ = phases[i_phase]
                if cutlass.const_expr(P.dynamic):
                    units = fixed
                u0 = Int32((Int64(cta) * units) // C)
                u1 = Int32((Int64(cta + 1) * units) // C)
                for u in cutlass.range(u0, u1, unroll=1):
                    slot, phase, filled = request(
                        g_buf, g_map, s_ring, s_base, u, slot, phase, filled, lane, i_phase
                    )
            if cutlass.const_expr(P.dynamic):
                # Claims start after the previous kernel's end, so the counter holds a whole
                # number of launches' claims; the next claim is in flight while a stage is
                # requested.
                cute.arch.griddepcontrol_wait()
                g_claims = Int64(m_out.iterator.toint()) + Int64(claim_word * 4)
                value = claim(g_claims, lane)
                u = claimed_stage(value)
                while u < P.units:
                    value = claim(g_claims, lane)
                    slot, phase, filled = request(
                        g_buf, g_map, s_ring, s_base, u, slot, phase, filled, lane, 0
                    )
                    u = claimed_stage(value)
                if filled >= R:
                    ptx.mbarrier_wait(empty_bar(s_base, slot), phase ^ 1)
                if lane == 0:
                    ptx.st_shared_f32(unit_word(s_base, slot), ptx.i32_as_f32(Int32(_END)))
                    ptx.mbarrier_arrive(full_bar(s_base, slot))
        else:
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
            acc = Int32(0)
            if cutlass.const_expr(P.dynamic):
                _, _, _, copy, _ = phases[0]
                more = Int32(1)
                while more != 0:
                    ptx.mbarrier_wait(full_bar(s_base, slot), phase)
                    if ptx.f32_as_i32(ptx.ld_shared_f32(unit_word(s_base, slot))) == _END:
                        more = Int32(0)
                    else:
                        acc = read_stage(s_base, s_ring, slot, copy, tid, lane, acc)
                    slot, phase = ring_next(slot, phase)
            else:
                for i_phase in cutlass.range_constexpr(len(phases)):
                    _, units, _, copy, _ = phases[i_phase]
                    if cutlass.const_expr(i_phase > 0 and P.barrier):
                        wait_for_every_cta(Int64(m_out.iterator.toint()), tid)
                    u0 = Int32((Int64(cta) * units) // C)
                    u1 = Int32((Int64(cta + 1) * units) // C)
                    for _u in cutlass.range(u0, u1, unroll=1):
                        ptx.mbarrier_wait(full_bar(s_base, slot), phase)
                        acc = read_stage(s_base, s_ring, slot, copy, tid, lane, acc)
                        slot, phase = ring_next(slot, phase)
            m_out[cta * (32 * W) + tid] = acc

    @cute.jit
    def read_stage(s_base, s_ring, slot, copy: cutlass.Constexpr, tid, lane, acc):
        """A consumer thread's share of a stage (the XOR of its 16-byte words), then the
        warp's release of the slot."""
        for w in cutlass.range(tid, P.copies * copy // 16, 32 * W, unroll=1):
            v = ptx.ld_shared_v4(s_ring + slot * P.stage_bytes + w * 16)
            acc = acc ^ v[0] ^ v[1] ^ v[2] ^ v[3]
        cute.arch.sync_warp()
        if lane == 0:
            ptx.mbarrier_arrive(empty_bar(s_base, slot))
        return acc

    @cute.jit
    def wait_for_every_cta(g_out: Int64, tid: Int32):
        """The consumers of every CTA are done with the first phase: this CTA's arrive
        (after its consumer warps' barrier), then a spin until the count reaches the next
        multiple of the grid size (the count only grows, launch after launch)."""
        ptx.bar_sync(1, 32 * W)
        if tid == 0:
            g_count = g_out + Int64(count_word * 4)
            before = ptx.atom_add_acq_rel_gpu(g_count, Int32(1))
            target = (before // C + 1) * C
            seen = ptx.ld_acquire_gpu_u32(g_count)
            while seen < target:
                seen = ptx.ld_acquire_gpu_u32(g_count)
        ptx.bar_sync(1, 32 * W)

    options = launch_options(P.ctas, P.threads, P.smem_bytes)

    @cute.jit
    def launch(m_out: cute.Tensor, m_buf: cute.Tensor, stream: Any):
        kernel(m_out, m_buf).launch(stream=stream, **options)

    @cute.jit
    def tensor_launch(m_out: cute.Tensor, m_buf: cute.Tensor, m_map: cute.Tensor, stream: Any):
        tensor_kernel(m_out, m_buf, m_map).launch(stream=stream, **options)

    return tensor_launch if P.tensor else launch


def compile_cubin(params: ReadParams, arch: str) -> KernelBinary:
    """Compile one read_floor kernel for ``arch`` ("sm_90a") on any machine, GPU or not."""
    import cutlass
    import cutlass.cute as cute

    from mlpjit.kernels.cubin import compile_to_cubin, row_major_tensor

    m_out = row_major_tensor(cutlass.Int32, (params.out_words,))
    m_buf = row_major_tensor(cutlass.Uint8, (params.total_bytes,))
    stream = cute.runtime.make_fake_stream()
    tensors = [m_out, m_buf]
    if params.tensor:
        tensors.append(row_major_tensor(cutlass.Uint8, (MAP_BYTES,)))
    cubin, symbol = compile_to_cubin(_program(params), *tensors, stream, arch=arch)
    return KernelBinary(
        cubin=cubin,
        symbol=symbol,
        grid=(params.ctas, 1, 1),
        block=(params.threads, 1, 1),
        smem_bytes=params.smem_bytes,
        pdl=True,
        params=TENSOR_PARAMS if params.tensor else PARAMS,
    )
