"""Latency summaries: mean and p50 / p90 / p95 / p99, and small identity-keyed caches."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

import numpy as np

PERCENTILE_NAMES: tuple[str, ...] = ("mean", "p50", "p90", "p95", "p99")
QUANTILES: tuple[float, ...] = (0.50, 0.90, 0.95, 0.99)


@dataclass(frozen=True, eq=False)
class Percentiles:
    """A latency distribution in seconds: ``mean``, ``p50``, ``p90``, ``p95``, ``p99``.

    An unstable configuration is ``Percentiles.unbounded()`` (every field ``inf``), never finite.
    """

    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Percentiles):
            return NotImplemented
        return all(self.at(n) == other.at(n) for n in PERCENTILE_NAMES)

    def __hash__(self) -> int:
        return hash(tuple(self.at(n) for n in PERCENTILE_NAMES))

    def at(self, name: str) -> float:
        """The value for ``"mean"``, ``"p50"``, ``"p90"``, ``"p95"`` or ``"p99"``."""
        if name not in PERCENTILE_NAMES:
            raise ValueError(f"unknown percentile {name!r}; expected one of {', '.join(PERCENTILE_NAMES)}")
        return float(getattr(self, name))

    @property
    def finite(self) -> bool:
        return math.isfinite(self.p99) and math.isfinite(self.mean)

    def to_dict(self) -> dict[str, float]:
        return {name: self.at(name) for name in PERCENTILE_NAMES}

    @staticmethod
    def unbounded() -> "Percentiles":
        inf = float("inf")
        return Percentiles(inf, inf, inf, inf, inf)

    @staticmethod
    def zero() -> "Percentiles":
        return Percentiles(0.0, 0.0, 0.0, 0.0, 0.0)

    @staticmethod
    def from_samples(values: Iterable[float] | np.ndarray) -> "Percentiles":
        """Empirical summary; quantiles interpolate linearly (as numpy and ``vllm bench serve`` do)."""
        a = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
        if a.size == 0:
            return Percentiles.zero()
        p50, p90, p95, p99 = np.percentile(a, [100 * q for q in QUANTILES])
        return Percentiles(float(a.mean()), float(p50), float(p90), float(p95), float(p99))


V = TypeVar("V")


class IdentityCache:
    """A small LRU cache keyed on object identity (``is``), not equality.

    Hashing a frozen dataclass re-hashes all its fields on every call (slow for a length
    distribution holding thousands of trace values); identity is O(1). The cache keeps a strong
    reference to each key so an ``id`` is never reused while its entry lives.
    """

    def __init__(self, maxsize: int = 64) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[tuple[object, ...], tuple[tuple[object, ...], object]] = OrderedDict()
        self._lock = threading.Lock()  # the search may evaluate from several threads

    def get(self, keys: tuple[object, ...], make: Callable[[], V]) -> V:
        ident = tuple(k if isinstance(k, (int, float, bool, str)) else id(k) for k in keys)
        with self._lock:
            hit = self._data.get(ident)
            if hit is not None and all(a is b or a == b for a, b in zip(hit[0], keys)):
                self._data.move_to_end(ident)
                return hit[1]  # type: ignore[return-value]
        value = make()
        with self._lock:
            self._data[ident] = (keys, value)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value


class LazyPercentiles(Percentiles):
    """A ``Percentiles`` whose values are computed on first access.

    The analytic model evaluates hundreds of quasi-random points per metric; the search usually
    reads one or two metrics of a result, so the work is deferred until a field is read. It behaves
    as a plain ``Percentiles`` in every other respect (equality, repr, ``to_dict``, pickling).
    """

    def __init__(self, compute: Callable[[], Percentiles]) -> None:  # noqa: D107 (no dataclass init)
        object.__setattr__(self, "_compute", compute)

    def __getattr__(self, name: str) -> float:  # only reached while the fields are not set yet
        compute = self.__dict__.get("_compute")
        if name not in PERCENTILE_NAMES or compute is None:
            raise AttributeError(name)
        done = compute()
        for f in PERCENTILE_NAMES:
            object.__setattr__(self, f, float(getattr(done, f)))
        object.__setattr__(self, "_compute", None)
        return float(getattr(done, name))

    def __reduce__(self) -> tuple[type, tuple[float, ...]]:
        return (Percentiles, tuple(self.at(n) for n in PERCENTILE_NAMES))
