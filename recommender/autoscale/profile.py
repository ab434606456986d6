"""Traffic over a day: a diurnal rate profile and the day's arrivals (Poisson or a tiled real trace).

The profile is a cosine around the mean rate ``m`` with peak-to-trough ratio ``k`` (``k = 1``: constant)::

    a          = (k - 1) / (k + 1)                      (so (1 + a) / (1 - a) = k)
    lambda(t)  = m (1 + a cos(2 pi (t - t_peak) / P))   requests/s, P = period_s (a day)
    Lambda(t)  = integral_0^t lambda = m (t + a P / (2 pi) (sin(2 pi (t - t_peak) / P) + sin(2 pi t_peak / P)))

Arrivals are a time change of a unit-rate point process ``u_1 < u_2 < ...``: ``t_i = Lambda^-1(u_i)`` has
intensity ``lambda(t)``. The unit-rate process is Poisson (exponential gaps), or a real trace tiled end to end
with its times scaled by its own mean rate (``u = s x r_trace``), which keeps the trace's burstiness within
minutes and imposes the diurnal shape on top. ``Lambda`` is increasing (``lambda > 0`` for ``k`` finite), so
the inverse is found by Newton's method from ``u / m``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from recommender.errors import ConfigError

DAY_S = 86_400.0
MAX_PEAK_TO_TROUGH = 100.0


@dataclass(frozen=True, kw_only=True)
class DiurnalProfile:
    """``mean_rate_per_s`` over the period, ``peak_to_trough`` >= 1, the peak at ``peak_hour`` (0-24)."""

    mean_rate_per_s: float
    peak_to_trough: float = 1.0
    peak_hour: float = 14.0
    period_s: float = DAY_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_rate_per_s) and self.mean_rate_per_s > 0):
            raise ConfigError(f"traffic profile: mean rate must be a positive number of requests/s, got {self.mean_rate_per_s!r}")
        if not (math.isfinite(self.peak_to_trough) and 1.0 <= self.peak_to_trough <= MAX_PEAK_TO_TROUGH):
            raise ConfigError(f"traffic profile: peak_to_trough must be in [1, {MAX_PEAK_TO_TROUGH:g}], got {self.peak_to_trough!r}")
        if not (math.isfinite(self.peak_hour) and 0.0 <= self.peak_hour < 24.0):
            raise ConfigError(f"traffic profile: peak_hour must be in [0, 24), got {self.peak_hour!r}")
        if not (math.isfinite(self.period_s) and 60.0 <= self.period_s <= 7 * DAY_S):
            raise ConfigError(f"traffic profile: period must be 1 min to 7 days, got {self.period_s!r} s")

    @property
    def amplitude(self) -> float:
        """``a = (k - 1) / (k + 1)``."""
        return (self.peak_to_trough - 1.0) / (self.peak_to_trough + 1.0)

    @property
    def peak_s(self) -> float:
        return self.peak_hour / 24.0 * self.period_s

    @property
    def peak_rate_per_s(self) -> float:
        return self.mean_rate_per_s * (1.0 + self.amplitude)

    @property
    def trough_rate_per_s(self) -> float:
        return self.mean_rate_per_s * (1.0 - self.amplitude)

    def rate_per_s(self, t_s: np.ndarray | float) -> np.ndarray:
        """``lambda(t)``."""
        w = 2.0 * math.pi / self.period_s
        return self.mean_rate_per_s * (1.0 + self.amplitude * np.cos(w * (np.asarray(t_s, dtype=float) - self.peak_s)))

    def cumulative(self, t_s: np.ndarray | float) -> np.ndarray:
        """``Lambda(t)``: expected arrivals in ``[0, t]``."""
        w = 2.0 * math.pi / self.period_s
        t = np.asarray(t_s, dtype=float)
        return self.mean_rate_per_s * (t + self.amplitude / w * (np.sin(w * (t - self.peak_s)) + math.sin(w * self.peak_s)))

    def invert(self, u: np.ndarray) -> np.ndarray:
        """``Lambda^-1(u)`` by Newton's method (Lambda is increasing and its slope is at least m (1 - a) > 0)."""
        t = np.asarray(u, dtype=float) / self.mean_rate_per_s
        for _ in range(50):
            step = (self.cumulative(t) - u) / self.rate_per_s(t)
            t = t - step
            if float(np.max(np.abs(step), initial=0.0)) < 1e-9:
                break
        return t

    def max_growth(self, horizon_s: float) -> float:
        """``max_t lambda(t + horizon) / lambda(t)``: how much the rate can rise while a new replica starts."""
        t = np.arange(0.0, self.period_s, 60.0)
        ratio = self.rate_per_s(t + horizon_s) / self.rate_per_s(t)
        return float(max(1.0, np.max(ratio)))


@dataclass(frozen=True)
class DayTraffic:
    """The day's requests: arrival times (s, sorted), prompt and output tokens; for a tiled trace, the
    requests in one tile (its bursts recur every ``tile_requests / lambda(t)`` seconds)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str
    tile_requests: int | None = None

    def burst_period_s(self, profile: DiurnalProfile) -> float | None:
        """The longest time between a tile's recurrences: one tile at the trough's rate (None: Poisson)."""
        return None if self.tile_requests is None else self.tile_requests / profile.trough_rate_per_s

    def peak_window_rate_per_s(self, window_s: float, period_s: float) -> float:
        """The highest arrival rate over the day's windows of ``window_s``."""
        edges = np.append(np.arange(0.0, period_s, window_s), period_s)
        counts = np.diff(np.searchsorted(self.arrival_s, edges))
        return float(np.max(counts / np.diff(edges), initial=0.0))


def poisson_day(profile: DiurnalProfile, prompts: np.ndarray, outputs: np.ndarray, *, seed: int) -> DayTraffic:
    """A non-homogeneous Poisson day: unit-rate Poisson points mapped through ``Lambda^-1``; lengths are drawn
    with replacement from ``prompts`` / ``outputs`` (e.g. samples of the workload's distributions)."""
    rng = np.random.default_rng(seed)
    total = float(profile.cumulative(profile.period_s))
    n = int(rng.poisson(total))
    u = np.sort(rng.uniform(0.0, total, size=n))
    idx = rng.integers(0, len(prompts), size=n)
    return DayTraffic(profile.invert(u), np.asarray(prompts)[idx], np.asarray(outputs)[idx], "poisson")


def tiled_trace_day(profile: DiurnalProfile, arrival_s: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
                    *, source: str) -> DayTraffic:
    """A real trace (times from 0, its lengths) tiled end to end and time-changed onto the profile.

    The trace's own rate is ``r = n / span``; a tile adds ``span`` seconds. Its times scaled by ``r`` are a
    unit-rate process with the trace's burstiness; tiles are added until ``Lambda(P)`` points are reached."""
    a = np.asarray(arrival_s, dtype=float)
    if a.size < 2 or not np.all(np.diff(a) >= 0):
        raise ConfigError(f"{source}: a trace needs at least two requests in time order")
    a = a - a[0]
    if not a[-1] > 0:  # every request at one instant: no rate (n / 0 s) and no burstiness to tile
        raise ConfigError(f"{source}: its {a.size} requests all share one timestamp, a time span of 0 s; a trace needs "
                          "requests over a time span (its rate is requests / span): give a longer request log")
    gap = float(np.mean(np.diff(a)))
    span = float(a[-1]) + gap  # the next tile starts one mean gap after this one's last request
    rate = a.size / span
    total = float(profile.cumulative(profile.period_s))
    tiles = int(math.ceil(total / a.size))
    u = (a[None, :] + span * np.arange(tiles)[:, None]).ravel() * rate
    keep = u < total
    n = int(np.count_nonzero(keep))
    reps = np.tile(np.arange(a.size), tiles)[:n]
    return DayTraffic(profile.invert(u[keep]), np.asarray(prompts)[reps], np.asarray(outputs)[reps], source,
                      tile_requests=int(a.size))
