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
# Thread block clusters of up to 2 CTAs fill every CTA slot; of 4 or 8 only 10/11 of them
# (H200: 30 clusters of 4 = 120 CTAs at one CTA per SM, 30 of 8 = 240 at two;
# cuOccupancyMaxActiveClusters): the SMs of a GPC do not divide into them.
MAX_FULL_CLUSTER = 2
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


def resident_ctas(slots: int, cluster: int) -> int:
    """CTAs in clusters of ``cluster`` that can be resident at once on ``slots`` CTA slots
    (SMs x CTAs per SM); a larger grid runs its last clusters as a second wave. 0 when not
    even one cluster fits: such a launch cannot run, and the planner skips it."""
    if cluster <= MAX_FULL_CLUSTER:
        return slots
    return int(LARGE_CLUSTER_RESIDENCY * slots) // cluster * cluster
