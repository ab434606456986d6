"""Request logs as a traffic source: JSONL or CSV, one request per line.

The file is read by the one request reader, :func:`recommender.load.trace.parse_requests` (its docstring lists
the columns: the Azure LLM inference trace CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``, OpenAI responses and
Batch API output lines with ``usage``, an optional ``cached_tokens`` column), with this module's error type.
``cached_tokens`` gives the observed prefix-cache share ``sum(cached) / sum(prompt)`` of the window.

A run looks at the last ``window_s`` of the log, ending now for a live log (newest request less than a
window old) or at the newest request for a replayed one: ``rate = requests in window / span`` with
``span = min(window_s, end - oldest)``. For the forecast the
span is cut into ``k = max(1, floor(span / subwindow_s))`` equal sub-windows, each with its own rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike

from recommender.bounded import read_file_text
from recommender.errors import ConfigError, TrafficSourceError
from recommender.load.trace import parse_requests
from recommender.replan.observation import InsufficientDataError, LengthObservation, Observation, RatePoint


@dataclass(frozen=True)
class RequestLog:
    """Requests sorted by time: unix ``timestamps_s`` and token counts (numpy arrays of equal length)."""

    timestamps_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    where: str = "<log>"
    cached_tokens: np.ndarray | None = None  # prompt tokens served from the prefix cache, when logged

    @staticmethod
    def of(timestamps_s: ArrayLike, prompt_tokens: ArrayLike, output_tokens: ArrayLike, where: str = "<log>",
           cached_tokens: ArrayLike | None = None) -> "RequestLog":
        t = np.asarray(timestamps_s, dtype=float)
        order = np.argsort(t, kind="stable")
        cached = None if cached_tokens is None else np.asarray(cached_tokens, dtype=np.int64)[order]
        return RequestLog(t[order], np.asarray(prompt_tokens, dtype=np.int64)[order],
                          np.asarray(output_tokens, dtype=np.int64)[order], where, cached)

    def __len__(self) -> int:
        return int(self.timestamps_s.size)

    def until(self, end_s: float) -> "RequestLog":
        """Requests at or before ``end_s`` (replaying a log as if it were being written)."""
        i = int(np.searchsorted(self.timestamps_s, end_s, side="right"))
        return RequestLog(self.timestamps_s[:i], self.prompt_tokens[:i], self.output_tokens[:i], self.where,
                          None if self.cached_tokens is None else self.cached_tokens[:i])

    def merged(self, other: "RequestLog") -> "RequestLog":
        """Both logs' requests (e.g. one log per replica)."""
        cached = None
        if self.cached_tokens is not None and other.cached_tokens is not None:
            cached = np.concatenate([self.cached_tokens, other.cached_tokens])
        return RequestLog.of(np.concatenate([self.timestamps_s, other.timestamps_s]),
                             np.concatenate([self.prompt_tokens, other.prompt_tokens]),
                             np.concatenate([self.output_tokens, other.output_tokens]),
                             f"{self.where},{other.where}", cached)


def parse_request_log(text: str, where: str) -> RequestLog:
    """JSONL (first non-blank char ``{``) or CSV with a header row.

    An unreadable final line without its newline is left for the next run (a live log may be mid-write).
    """
    try:
        return _parse(text, where)
    except TrafficSourceError:
        if text.endswith("\n") or "\n" not in text.strip():
            raise
        # a live log's last line may still be being written: leave it for the next run
        return _parse(text[: text.rstrip().rindex("\n") + 1], where)


def _parse(text: str, where: str) -> RequestLog:
    if not text.strip():
        return RequestLog.of([], [], [], where)
    r = parse_requests(text, where, error=TrafficSourceError)
    return RequestLog.of(r.timestamps_s, r.prompt_tokens, r.output_tokens, where, r.cached_tokens)


def read_request_log(path: str | Path) -> RequestLog:
    """Read a JSONL or CSV request log file (see the module docstring for columns)."""
    p = Path(path)
    try:
        text = read_file_text(p, "request log")
    except ConfigError as e:
        raise TrafficSourceError(str(e)) from None
    return parse_request_log(text, str(p))


def _bounded_samples(x: np.ndarray, max_samples: int) -> tuple[int, ...]:
    """At most ``max_samples`` evenly spaced order statistics of ``x`` (deterministic, keeps the shape)."""
    xs = np.sort(x)
    if xs.size > max_samples:
        xs = xs[np.round(np.linspace(0, xs.size - 1, max_samples)).astype(np.int64)]
    return tuple(int(max(1, v)) for v in xs)


def observe_log(log: RequestLog, *, window_s: float, subwindow_s: float, min_requests: int, min_span_s: float,
                max_samples: int, now_s: float | None = None) -> Observation:
    """Rate, sub-window rates and length samples of the last ``window_s`` of ``log``.

    The window ends at ``now_s`` when the log is live (its newest request is less than ``window_s``
    old, so quiet minutes count as zero traffic), else at the newest request (a replayed or old log).
    Raises InsufficientDataError naming how many more requests / seconds of log are needed.
    """
    if now_s is not None:  # requests stamped after "now" (clock skew, or a replay) are not seen yet
        log = log.until(now_s) if len(log) and log.timestamps_s[-1] > now_s else log
    if len(log) == 0:
        raise InsufficientDataError(f"insufficient data: request log {log.where} holds no requests; need at "
                                    f"least {min_requests} requests over {min_span_s:.0f} s; keeping the current plan")
    newest = float(log.timestamps_s[-1])
    notes: tuple[str, ...] = ()
    if now_s is not None and now_s < newest + window_s:
        end = now_s
    else:
        end = newest
        if now_s is not None:
            notes += (f"{log.where}: newest request is {now_s - newest:.0f} s old (more than the window); observed "
                      f"the log's last {window_s:.0f} s as a replay",)
    start = max(end - window_s, float(log.timestamps_s[0]))
    lo = int(np.searchsorted(log.timestamps_s, start, side="left"))
    hi = int(np.searchsorted(log.timestamps_s, end, side="right"))
    t = log.timestamps_s[lo:hi]
    n = int(t.size)
    span = end - start
    if n < min_requests or span < min_span_s:
        more = []
        if n < min_requests:
            more.append(f"{min_requests - n} more request(s)")
        if span < min_span_s:
            more.append(f"{min_span_s - span:.0f} s more of log")
        raise InsufficientDataError(
            f"insufficient data: the last {window_s:.0f} s of {log.where} hold {n} request(s) over {span:.0f} s; "
            f"need at least {min_requests} requests over {min_span_s:.0f} s ({' and '.join(more)}); keeping the "
            f"current plan")
    k = max(1, int(span // subwindow_s))
    edges = np.linspace(start, end, k + 1)
    counts = np.histogram(t, bins=edges)[0]
    sub = span / k
    points = tuple(RatePoint(float(edges[i + 1]), sub, float(counts[i]) / sub) for i in range(k))
    prompt = log.prompt_tokens[lo:hi]
    output = log.output_tokens[lo:hi]
    share = None
    if log.cached_tokens is not None and prompt.sum() > 0:
        share = float(log.cached_tokens[lo:hi].sum()) / float(prompt.sum())
    if span < window_s:
        notes += (f"{log.where} covers {span:.0f} s, less than the {window_s:.0f} s window; the rate is over "
                  f"what there is",)
    return Observation(
        source="request-log", where=(log.where,), end_s=end, window_s=span, requests=float(n),
        arrival_rate_per_s=n / span, rate_points=points,
        prompt_tokens=LengthObservation(n, float(prompt.mean()), samples=_bounded_samples(prompt, max_samples)),
        output_tokens=LengthObservation(n, float(output.mean()), samples=_bounded_samples(output, max_samples)),
        prompt_tokens_per_s=float(prompt.sum()) / span, output_tokens_per_s=float(output.sum()) / span,
        notes=notes, prefix_share=share)


@dataclass
class RequestLogSource:
    """One or more request-log files (several = one per replica, merged) or an in-memory log."""

    paths: tuple[str, ...] = ()
    log: RequestLog | None = None
    window_s: float = 900.0
    subwindow_s: float = 60.0
    min_requests: int = 20
    min_span_s: float = 60.0
    max_samples: int = 2000
    clock: Callable[[], float] | None = time.time

    def load(self) -> RequestLog:
        if self.log is not None:
            return self.log
        unique: dict[str, str] = {}
        for p in self.paths:
            unique.setdefault(str(Path(p).resolve()), p)
        logs = [read_request_log(p) for p in unique.values()]  # the same file named twice would count twice
        merged = logs[0]
        for other in logs[1:]:
            merged = merged.merged(other)
        return merged

    def observe(self) -> Observation:
        return observe_log(self.load(), window_s=self.window_s, subwindow_s=self.subwindow_s,
                           min_requests=self.min_requests, min_span_s=self.min_span_s, max_samples=self.max_samples,
                           now_s=self.clock() if self.clock is not None else None)
