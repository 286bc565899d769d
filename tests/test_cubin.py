"""mlpjit.kernels.cubin's launch options (plain Python: no cutlass, no GPU)."""

from __future__ import annotations

from mlpjit.kernels.cubin import launch_options


def test_launch_options_bound_carveout_and_cluster_only_where_asked() -> None:
    plain = launch_options(132, 320, 100_000)
    assert plain == dict(grid=[132, 1, 1], block=[320, 1, 1], smem=100_000, use_pdl=True)
    assert launch_options(132, 320, 100_000, ctas_per_sm=1) == dict(plain, min_blocks_per_mp=1)
    two = launch_options(264, 320, 50_000, ctas_per_sm=2, cluster_ctas=4)
    assert two["min_blocks_per_mp"] == 2 and two["preferred_smem_carveout"] == 100
    assert two["cluster"] == [4, 1, 1] and two["grid"] == [264, 1, 1]
