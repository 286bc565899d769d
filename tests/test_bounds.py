import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlpjit.jit.bounds import bounded, check_wait, clamped, seconds


@pytest.mark.parametrize(
    "value", ["1e308", "inf", "nan", "9" * 5000, 10**400, float("inf"), True, None, "", "x", [1]]
)
def test_bounded_refuses_with_the_name(value):
    with pytest.raises(ValueError, match=r"^MLPJIT_X must be a number in \[0, 100\]"):
        bounded(value, "MLPJIT_X", 0, 100)


def test_bounded_integer_accepts_integral_floats_only():
    assert bounded("1e3", "n", 0, 10**4, integer=True) == 1000
    assert bounded(7.0, "n", 0, 10, integer=True) == 7
    with pytest.raises(ValueError, match="n must be an integer"):
        bounded(7.5, "n", 0, 10, integer=True)


def test_clamped_falls_back_and_clamps():
    assert clamped(10**400, 0, 5, default=1) == 1
    assert clamped(1e300, 0, 5, default=1) == 5
    assert clamped("-3", 0, 5, default=1) == 0
    assert clamped("bogus", 0, 5, default=1) == 1


@given(st.one_of(st.integers(), st.floats(), st.text(max_size=80), st.none(), st.booleans()))
def test_bounded_never_crashes_otherwise(value):
    try:
        number = bounded(value, "v", -1e6, 1e6)
    except ValueError as err:
        assert str(err).startswith("v must be") and "\n" not in str(err)
    else:
        assert math.isfinite(number) and -1e6 <= number <= 1e6


def test_bounded_shows_integer_ranges_in_full_and_huge_values_briefly():
    with pytest.raises(ValueError, match=r"in \[1, 1048576\] \(got an integer of 16610 bits\)$"):
        bounded(10**5000, "n", 1, 1 << 20, integer=True)


def test_seconds_reads_numbers_and_only_text_when_told():
    assert seconds(2, "wait", (0.01, 10.0)) == 2.0
    assert seconds("2.5", "MLPJIT_X", (0.01, 10.0), text=True) == 2.5
    for bad in ("2.5", True, None):
        with pytest.raises(ValueError, match="wait must be a number of seconds"):
            seconds(bad, "wait", (0.01, 10.0))
    for bad in (0, 11, float("nan"), 1e308):
        with pytest.raises(ValueError, match=r"wait must be a number in \[0.01, 10\]"):
            seconds(bad, "wait", (0.01, 10.0))


def test_a_lock_waits_a_positive_time():
    assert check_wait(0.5) == 0.5
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
            check_wait(bad)
