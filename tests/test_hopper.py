"""The resource facts the planners use: cluster residency."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlpjit.kernels import hopper


def test_resident_ctas_are_the_measured_clusters_on_132_sms() -> None:
    # cuOccupancyMaxActiveClusters on the H100 (and, where measured, the H200)
    assert hopper.resident_ctas(hopper.SMS, 1, 4) == 120
    assert hopper.resident_ctas(hopper.SMS, 2, 8) == 240
    assert hopper.resident_ctas(hopper.SMS, 1, 3) == 117  # 39 clusters, not 40
    assert hopper.resident_ctas(hopper.SMS, 1, 7) == 105
    # four CTAs per SM: two layers of the two-CTA count
    assert hopper.resident_ctas(hopper.SMS, 4, 3) == 2 * 79 * 3


@given(
    sms=st.sampled_from([hopper.SMS, 114, 78, 16, 8]),
    ctas_per_sm=st.integers(1, 4),
    cluster=st.integers(1, 8),
)
def test_resident_ctas_are_whole_clusters_within_the_slots(sms, ctas_per_sm, cluster) -> None:
    ctas = hopper.resident_ctas(sms, ctas_per_sm, cluster)
    assert 0 <= ctas <= sms * ctas_per_sm and ctas % cluster == 0
    if cluster <= hopper.MAX_FULL_CLUSTER:
        assert ctas == sms * ctas_per_sm
    # more slots per SM never hold fewer clusters
    assert hopper.resident_ctas(sms, ctas_per_sm + 1, cluster) >= ctas
