"""Units at the boundary (recommender/units.py): human strings in, SI floats out.

Expected values are written out by hand from the unit definitions (decimal prefixes for "GB",
"TB/s" as vendor datasheets print them; 1024-based for "GiB"), never taken from the parser itself.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recommender import units
from recommender.errors import RecommenderError, UnitError


# --------------------------------------------------------------------------- bytes
@pytest.mark.parametrize(
    "text, expected",
    [
        ("80GB", 80_000_000_000.0),            # H100 datasheet "80GB": decimal gigabytes
        ("80 GB", 80_000_000_000.0),
        ("24 GiB", 24 * 1024**3),              # = 25,769,803,776 B
        ("24GiB", 25_769_803_776.0),
        ("141 GB", 141e9),
        ("1.5 TB", 1.5e12),
        ("512 MiB", 536_870_912.0),
        ("320 KiB", 327_680.0),                # the 70B seed's KV bytes per token, 2 x 80 x 8 x 128 x 2
        ("0.5GB", 5e8),
        ("1,000 GB", 1e12),                    # thousands separators are tolerated
        ("123", 123.0),                        # a bare number is bytes
        ("7B", 7.0),                           # "B" alone is bytes (7 bytes, not 7 billion)
        (2e9, 2e9),                            # numbers pass through
        (16, 16.0),
    ],
)
def test_parse_bytes(text, expected) -> None:
    assert units.parse_bytes(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["80 GX", "eighty GB", "80 Gb/s", "GB", "", "80 G B", "1e GB", "80 XiB"])
def test_parse_bytes_rejects_bad_strings(bad) -> None:
    with pytest.raises(UnitError):
        units.parse_bytes(bad)


def test_parse_bytes_rejects_bool_and_names_the_quantity() -> None:
    with pytest.raises(UnitError, match="memory"):
        units.parse_bytes(True, "memory")
    with pytest.raises(UnitError, match="hbm"):
        units.parse_bytes("lots", "hbm")


# --------------------------------------------------------------------------- bandwidth
@pytest.mark.parametrize(
    "text, expected",
    [
        ("3.35 TB/s", 3.35e12),                # H100 SXM HBM3
        ("3.35TB/s", 3.35e12),
        ("900 GB/s", 9e11),
        ("64 GiB/s", 64 * 1024**3),
        ("2039 GB/s", 2.039e12),               # A100 80GB
        (4.8e12, 4.8e12),
    ],
)
def test_parse_bandwidth(text, expected) -> None:
    assert units.parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["3.35 TB", "3.35 TB/h", "fast", "3.35 Tb/s/s", "3.35 XB/s"])
def test_parse_bandwidth_rejects_bad_strings(bad) -> None:
    with pytest.raises(UnitError):
        units.parse_bandwidth(bad)


# --------------------------------------------------------------------------- FLOP/s
@pytest.mark.parametrize(
    "text, expected",
    [
        ("989 TFLOPS", 989e12),
        ("1979 TOPS", 1.979e15),
        ("2.5 PFLOPS", 2.5e15),
        ("312 TFLOP/s", 312e12),
        (1e15, 1e15),
    ],
)
def test_parse_flops(text, expected) -> None:
    assert units.parse_flops(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["989 TB/s", "989 teraflops", "many"])
def test_parse_flops_rejects_bad_strings(bad) -> None:
    with pytest.raises(UnitError):
        units.parse_flops(bad)


# --------------------------------------------------------------------------- durations
@pytest.mark.parametrize(
    "text, expected",
    [
        ("30ms", 0.030),
        ("30 ms", 0.030),
        ("2s", 2.0),
        ("2", 2.0),                            # bare numbers are seconds
        ("250us", 250e-6),
        ("250µs", 250e-6),
        ("1.5min", 90.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        (0.5, 0.5),
    ],
)
def test_parse_duration(text, expected) -> None:
    assert units.parse_duration_s(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["30 parsecs", "30 mss", "soon", "ms", "30 days"])
def test_parse_duration_rejects_bad_strings(bad) -> None:
    with pytest.raises(UnitError):
        units.parse_duration_s(bad)


# --------------------------------------------------------------------------- prices
@pytest.mark.parametrize(
    "text, expected",
    [
        ("$2.49/h", 2.49),
        ("2.49", 2.49),
        ("2.49/hr", 2.49),
        ("$3.99/hour", 3.99),
        ("$ 2.5 / h", 2.5),
        (2.5, 2.5),
        (3, 3.0),
    ],
)
def test_parse_usd_per_hour(text, expected) -> None:
    assert units.parse_usd_per_hour(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["$2.49/day", "free", "€2.49/h", "2.49 USD", "$/h"])
def test_parse_usd_per_hour_rejects_bad_strings(bad) -> None:
    with pytest.raises(UnitError):
        units.parse_usd_per_hour(bad)


# --------------------------------------------------------------------------- counts
@pytest.mark.parametrize(
    "text, expected",
    [
        ("8k", 8000),                          # decimal, like vLLM's human-readable ints
        ("8K", 8000),
        ("1.5k", 1500),
        ("1M", 1_000_000),
        ("10", 10),
        ("8_000", 8000),
        (32, 32),
    ],
)
def test_parse_count(text, expected) -> None:
    got = units.parse_count(text)
    assert got == expected
    assert isinstance(got, int)


@pytest.mark.parametrize("bad", ["8ki", "8 tokens", "lots", "8kk", ""])
def test_parse_count_rejects_bad_strings(bad) -> None:
    with pytest.raises(UnitError):
        units.parse_count(bad)


def test_unit_error_is_a_recommender_error_and_a_value_error() -> None:
    # The CLI turns RecommenderError into one line; callers that only know ValueError still catch it.
    with pytest.raises(RecommenderError):
        units.parse_bytes("80 GX")
    with pytest.raises(ValueError):
        units.parse_bytes("80 GX")


# --------------------------------------------------------------------------- formatting
@pytest.mark.parametrize(
    "n, text",
    [(8.0e10, "80.0 GB"), (1.0e9, "1.00 GB"), (1.4e11, "140 GB"), (327_680, "328 KB"), (5.0, "5 B"), (2.75e12, "2.75 TB")],
)
def test_fmt_bytes(n, text) -> None:
    assert units.fmt_bytes(n) == text


@pytest.mark.parametrize(
    "s, text", [(0.0052, "5.20 ms"), (2.5, "2.50 s"), (12e-6, "12.0 µs"), (math.inf, "inf"), (0.0115, "11.50 ms")]
)
def test_fmt_seconds(s, text) -> None:
    assert units.fmt_seconds(s) == text


# --------------------------------------------------------------------------- properties
_values = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(_values, st.sampled_from([("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12), ("GiB", 1024.0**3), ("MiB", 1024.0**2)]))
def test_bytes_scale_with_the_prefix(value: float, unit: tuple[str, float]) -> None:
    suffix, scale = unit
    assert units.parse_bytes(f"{value!r} {suffix}") == pytest.approx(value * scale, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(_values)
def test_ms_is_a_thousandth_of_s(value: float) -> None:
    assert units.parse_duration_s(f"{value!r}ms") == pytest.approx(units.parse_duration_s(f"{value!r}s") / 1000, rel=1e-12)
