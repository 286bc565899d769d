"""sm_90 (H100 / H200) resource facts the kernels plan with, and the two budgets they imply.

SMS is the SM count the tuned tables and the defaults are for (H200, H100 SXM); other
Hopper parts (H100 PCIe and H800 PCIe: 114, H20: 78) plan with their own count. The
planner takes any count in [MIN_SMS, MAX_SMS]: the smallest Hopper partition a kernel runs
on is a MIG 1g slice (16 SMs), and below 8 SMs a cluster of 8 CTAs (the largest the
kernels launch) cannot be resident, so nothing smaller describes a real GPU.
"""

from __future__ import annotations

import math

__all__ = [
    "MAX_SMS",
    "REGS_PER_SM",
    "SCHEDULERS",
    "SMEM_CTA_OVERHEAD",
    "SMEM_PER_CTA_MAX",
    "SMEM_PER_SM",
    "SMS",
    "THREADS_PER_CTA",
    "THREADS_PER_SM",
    "check_sms",
    "reg_budget",
    "resident_ctas",
    "smem_budget",
]

SMS = 132
MIN_SMS = 8
MAX_SMS = 1024
SMEM_PER_SM = 228 * 1024
SMEM_PER_CTA_MAX = 227 * 1024  # dynamic + static
SMEM_CTA_OVERHEAD = 2 * 1024  # 1 KB reserved by the system + 1 KB static (1024-aligned base)
REGS_PER_SM = 65536
SCHEDULERS = 4  # warp schedulers per SM, each with a quarter of the register file
THREADS_PER_SM = 2048
THREADS_PER_CTA = 1024
# Thread block clusters of up to 2 CTAs fill every CTA slot; larger ones leave SMs idle,
# since a cluster's CTAs must be resident in one GPC. RESIDENT_CLUSTERS: clusters of 1-8
# CTAs resident at once on the 132-SM parts at one and at two CTAs per SM, as
# cuOccupancyMaxActiveClusters reports them (H100 80GB HBM3; the H200 gave the same 30
# clusters of 4 at one and 30 of 8 at two). No split of the SMs into GPCs yields these
# counts, so they are taken as measured. Other SM counts plan with LARGE_CLUSTER_RESIDENCY
# of their slots for clusters of more than 2.
MAX_FULL_CLUSTER = 2
RESIDENT_CLUSTERS = {
    1: (132, 264), 2: (66, 132), 3: (39, 79), 4: (30, 62),
    5: (22, 47), 6: (17, 39), 7: (15, 32), 8: (15, 30),
}  # fmt: skip
LARGE_CLUSTER_RESIDENCY = 120 / 132


def check_sms(sms: int, name: str = "sms") -> int:
    """``sms`` if it is an SM count (an int in MIN_SMS..MAX_SMS), else a ValueError naming
    ``name`` (the argument it came from) and the range."""
    if isinstance(sms, bool) or not isinstance(sms, int) or not MIN_SMS <= sms <= MAX_SMS:
        from mlpjit.jit.bounds import shown

        raise ValueError(
            f"{name} must be an int in [{MIN_SMS}, {MAX_SMS}] (the GPU's SM count), "
            f"got {shown(sms)}"
        )
    return sms


def reg_budget(threads: int, ctas_per_sm: int) -> int:
    """Registers per thread under the launch bound: the register file is split over the SM's
    SCHEDULERS warp schedulers, so the scheduler with the most resident warps sets the bound
    (ptxas 13.0: 14 warps per SM get 128 registers, not 65536 / 448 = 146)."""
    warps_per_scheduler = math.ceil(math.ceil(threads / 32) * ctas_per_sm / SCHEDULERS)
    return min(255, REGS_PER_SM // SCHEDULERS // (32 * warps_per_scheduler) // 8 * 8)


def smem_budget(ctas_per_sm: int) -> int:
    """Dynamic shared memory one CTA may use when ctas_per_sm CTAs share an SM."""
    return min(SMEM_PER_CTA_MAX, SMEM_PER_SM // ctas_per_sm) - SMEM_CTA_OVERHEAD


def resident_ctas(sms: int, ctas_per_sm: int, cluster: int) -> int:
    """CTAs in clusters of ``cluster`` that can be resident at once on ``sms`` SMs with
    ``ctas_per_sm`` CTA slots each; a larger grid runs its last clusters as a second wave.
    0 when not even one cluster fits: such a launch cannot run, and the planner skips it.
    On the 132-SM parts more than two CTAs per SM count as pairs of two-CTA layers plus a
    one-CTA layer (a lower bound: each layer's clusters fit beside the others')."""
    slots = sms * ctas_per_sm
    if cluster <= MAX_FULL_CLUSTER:
        return slots
    if sms == SMS and cluster in RESIDENT_CLUSTERS:
        one, two = RESIDENT_CLUSTERS[cluster]
        return (ctas_per_sm // 2 * two + ctas_per_sm % 2 * one) * cluster
    return int(LARGE_CLUSTER_RESIDENCY * slots) // cluster * cluster
