"""Human-readable quantities in, SI floats out: the one place strings become numbers.

Everything inside the package is a plain float in base SI units whose name says the unit
(``memory_bytes``, ``decode_step_s``, ``hbm_bandwidth_bytes_per_s``, ``usd_per_hour``).
These parsers run once at the boundary (catalog loading, CLI flags, workload files).

Decimal prefixes (k, M, G, T, P = 1e3 ... 1e15) follow vendor datasheets ("80 GB", "3.35 TB/s");
binary prefixes (KiB, MiB, GiB, TiB) are 1024-based.
"""

from __future__ import annotations

import math
import re

from recommender.errors import UnitError

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KIB = 1024.0
MIB = 1024.0**2
GIB = 1024.0**3
MS = 1e-3
US = 1e-6
#: timestamps the tool accepts (unix seconds, also relative log times from 0): up to 2100-01-01T00:00:00Z
MAX_UNIX_S = 4102444800.0

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": KIB, "Mi": MIB, "Gi": GIB, "Ti": 1024.0**4}
_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"{what}: expected a number with a unit, got {text!r}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(r"\s*" + _NUMBER + r"\s*([A-Za-z/%$µ]*)\s*", str(text).replace(",", "").replace("_", ""))
        if not m:
            raise UnitError(f"{what}: cannot read {text!r} as a number with a unit")
        value, unit = float(m.group(1)), m.group(2)
    if not math.isfinite(value):
        raise UnitError(f"{what}: {text!r} is not a finite number")
    return value, unit


def _prefix(unit: str, base: str, text: object, what: str) -> float:
    """Multiplier for ``unit`` = <prefix><base>; '' and base alone mean 1."""
    if unit in ("", base):
        return 1.0
    if not unit.endswith(base):
        raise UnitError(f"{what}: unknown unit in {text!r} (expected e.g. G{base}, Gi{base}, T{base})")
    p = unit[: -len(base)]
    if p in _DECIMAL:
        return _DECIMAL[p]
    if p in _BINARY:
        return _BINARY[p]
    raise UnitError(f"{what}: unknown prefix {p!r} in {text!r}")


def parse_bytes(text: str | float | int, what: str = "size") -> float:
    """'80GB' -> 8.0e10, '24 GiB' -> 25769803776.0, 1e9 -> 1e9 (bytes)."""
    value, unit = _split(text, what)
    return value * _prefix(unit, "B", text, what)


def parse_bandwidth(text: str | float | int, what: str = "bandwidth") -> float:
    """'3.35 TB/s' -> 3.35e12 bytes per second."""
    value, unit = _split(text, what)
    if unit and not unit.endswith("B/s"):
        raise UnitError(f"{what}: expected bytes per second like '3.35TB/s', got {text!r}")
    return value * _prefix(unit[:-2] if unit else "", "B", text, what)


def parse_flops(text: str | float | int, what: str = "throughput") -> float:
    """'989 TFLOPS' or '1979 TOPS' -> operations per second."""
    value, unit = _split(text, what)
    for base in ("FLOPS", "OPS", "FLOP/s", "OP/s"):
        if unit.endswith(base):
            return value * _prefix(unit[: -len(base)] + "X", "X", text, what)
    if unit == "":
        return value
    raise UnitError(f"{what}: expected e.g. '989 TFLOPS', got {text!r}")


def parse_duration_s(text: str | float | int, what: str = "duration") -> float:
    """'30ms' -> 0.03, '2s' -> 2.0, '1.5min' / '5m' -> seconds, '1h' -> 3600. Bare numbers are seconds."""
    value, unit = _split(text, what)
    scale = {"": 1.0, "s": 1.0, "ms": MS, "us": US, "µs": US, "m": 60.0, "min": 60.0, "h": 3600.0}
    if unit not in scale:
        raise UnitError(f"{what}: unknown time unit {unit!r} in {text!r} (use ms, s, min or h)")
    return value * scale[unit]


def parse_usd_per_hour(text: str | float | int, what: str = "price") -> float:
    """'$2.49/h', '2.49', '2.49/hr' -> 2.49 USD per hour."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not math.isfinite(text):
            raise UnitError(f"{what}: {text!r} is not a finite price")
        return float(text)
    s = str(text).strip().replace(" ", "")
    m = re.fullmatch(r"\$?" + _NUMBER + r"(?:/(?:h|hr|hour))?", s)
    if not m:
        raise UnitError(f"{what}: cannot read {text!r} as USD per hour (e.g. '$2.49/h')")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise UnitError(f"{what}: {text!r} is not a finite price")
    return value


def parse_count(text: str | float | int, what: str = "count") -> int:
    """'8k' -> 8000, '1M' -> 1_000_000, '10' -> 10 (decimal prefixes, like vLLM's human_readable_int)."""
    value, unit = _split(text, what)
    if unit not in _DECIMAL:
        raise UnitError(f"{what}: unknown suffix {unit!r} in {text!r} (use k or M)")
    return int(round(value * _DECIMAL[unit]))


def fmt_bytes(n: float) -> str:
    """8.0e10 -> '80.0 GB', 1.0e9 -> '1.00 GB' (decimal units, as datasheets print; 3 significant digits)."""
    for unit, scale in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.0f} {unit}" if abs(v) >= 100 else f"{v:.{2 if abs(v) < 10 else 1}f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(s: float) -> str:
    """0.0052 -> '5.20 ms', 2.5 -> '2.50 s'."""
    if s != s or s == float("inf"):
        return "inf"
    if abs(s) < 1e-3:
        return f"{s / US:.1f} µs"
    if abs(s) < 1.0:
        return f"{s / MS:.2f} ms"
    return f"{s:.2f} s"
