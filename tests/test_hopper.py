"""The resource facts the planners use: cluster residency per GPC."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlpjit.kernels import hopper


def test_gpc_split_is_the_132_sm_part_and_gives_the_measured_cluster_counts() -> None:
    assert sum(hopper.GPC_SMS) == hopper.SMS
    assert all(n % 2 == 0 and n <= 18 for n in hopper.GPC_SMS)  # TPCs of 2 SMs, <= 9 a GPC
    # cuOccupancyMaxActiveClusters on the H200: 30 clusters of 4 at one CTA per SM, 30 of 8
    # at two (the model the fp8_gemv tables were planned with agrees on both).
    assert hopper.resident_clusters(hopper.SMS, 1, 4) == 30
    assert hopper.resident_clusters(hopper.SMS, 2, 8) == 30
    assert hopper.resident_ctas(hopper.SMS, 4) == 120
    assert hopper.resident_ctas(2 * hopper.SMS, 8) == 240


@pytest.mark.parametrize(("cluster", "clusters"), [(1, 132), (2, 66), (3, 42), (5, 22),
                                                   (6, 20), (7, 16), (8, 14)])  # fmt: skip
def test_clusters_of_any_size_count_per_gpc(cluster: int, clusters: int) -> None:
    assert hopper.resident_clusters(hopper.SMS, 1, cluster) == clusters


@given(
    sms=st.sampled_from([hopper.SMS, 114, 78, 16, 8]),
    ctas_per_sm=st.integers(1, 4),
    cluster=st.integers(1, 8),
)
def test_resident_clusters_never_exceed_the_slots(sms, ctas_per_sm, cluster) -> None:
    clusters = hopper.resident_clusters(sms, ctas_per_sm, cluster)
    assert 0 <= clusters * cluster <= sms * ctas_per_sm
    if cluster <= hopper.MAX_FULL_CLUSTER:
        assert clusters == sms * ctas_per_sm // cluster  # pairs of SMs fill every GPC
    if sms != hopper.SMS:
        assert clusters == hopper.resident_ctas(sms * ctas_per_sm, cluster) // cluster
