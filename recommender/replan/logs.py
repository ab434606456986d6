"""Request logs as a traffic source: JSONL or CSV, one request per line.

Accepted columns (case-insensitive): a timestamp (``timestamp``, ``TIMESTAMP``, ``time``, ``ts``), prompt
tokens (``prompt_tokens``, ``ContextTokens``, ``input_tokens``) and output tokens (``output_tokens``,
``GeneratedTokens``, ``completion_tokens``). This covers the Azure LLM inference trace CSV
(``TIMESTAMP,ContextTokens,GeneratedTokens``). Timestamps are ISO 8601 (naive = UTC) or unix epoch
numbers (seconds; values above 1e11 are read as milliseconds).

JSONL in the OpenAI response shape is read too: ``{"created": 1700000000, "usage": {"prompt_tokens": ..,
"completion_tokens": .., "prompt_tokens_details": {"cached_tokens": ..}}}``, also wrapped as a Batch API
output line (``{"response": {"body": {...}}}``). ``cached_tokens`` (optional, any format) gives the
observed prefix-cache share ``sum(cached) / sum(prompt)`` of the window.

A run looks at the last ``window_s`` of the log, ending now for a live log (newest request less than a
window old) or at the newest request for a replayed one: ``rate = requests in window / span`` with
``span = min(window_s, end - oldest)``. For the forecast the
span is cut into ``k = max(1, floor(span / subwindow_s))`` equal sub-windows, each with its own rate.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from numpy.typing import ArrayLike

from recommender.bounded import load_json_text, read_file_text
from recommender.errors import ConfigError, TrafficSourceError
from recommender.replan.observation import InsufficientDataError, LengthObservation, Observation, RatePoint
from recommender.units import MAX_UNIX_S
from recommender.workload import MAX_TOKENS

_TIME = ("timestamp", "time", "ts", "arrival_time", "created")
_PROMPT = ("prompt_tokens", "contexttokens", "input_tokens", "prompt_len")
_OUTPUT = ("output_tokens", "generatedtokens", "completion_tokens", "output_len")
_CACHED = ("cached_tokens", "cachedtokens", "prefix_cached_tokens")


def _flatten_openai(rec: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI response (or Batch API output line) as flat columns; other records unchanged."""
    resp = rec.get("response")
    if isinstance(resp, dict) and isinstance(resp.get("body"), dict):
        rec = {**{k: v for k, v in rec.items() if k != "response"}, **resp["body"]}
    usage = rec.get("usage")
    if not isinstance(usage, dict):
        return rec
    out = {k: v for k, v in rec.items() if k != "usage"}
    for key, names in (("prompt_tokens", ("prompt_tokens", "input_tokens")),
                       ("completion_tokens", ("completion_tokens", "output_tokens"))):
        if key not in out:
            out[key] = next((usage[n] for n in names if n in usage), None)
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None and "cached_tokens" not in out:
        out["cached_tokens"] = details["cached_tokens"]
    return out


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


def parse_timestamp_s(value: object, where: str) -> float:
    """ISO 8601 string (naive = UTC) or epoch number -> unix seconds."""
    if isinstance(value, bool) or value is None:
        raise TrafficSourceError(f"{where}: missing or invalid timestamp {value!r}")
    if isinstance(value, (int, float)):
        x = float(value)
    else:
        s = str(value).strip()
        try:
            x = float(s)
        except ValueError:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
            except ValueError:
                raise TrafficSourceError(f"{where}: cannot read timestamp {s!r} (use ISO 8601 like "
                                         f"2023-11-16 18:15:46.68 or unix seconds)") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            return _sane_time(dt.timestamp(), s, where)
    if not math.isfinite(x):
        raise TrafficSourceError(f"{where}: timestamp {value!r} is not finite")
    return _sane_time(x / 1000.0 if x > 1e11 else x, value, where)


def _sane_time(t: float, value: object, where: str) -> float:
    """Unix seconds from 0 (also a relative log's start) to 2100-01-01 (``units.MAX_UNIX_S``); else one line."""
    if not 0 <= t <= MAX_UNIX_S:
        raise TrafficSourceError(f"{where}: timestamp {str(value)[:40]!r} is {t:.4g} s, outside 0..{MAX_UNIX_S:.0f} s "
                                 f"(1970 to 2100); give unix seconds, milliseconds or ISO 8601")
    return t


def _tokens(value: object, where: str, column: str) -> int:
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TrafficSourceError(f"{where}: {column} {value!r} is not a token count") from None
    if not math.isfinite(n) or n < 0 or n > MAX_TOKENS:
        raise TrafficSourceError(f"{where}: {column} {str(value)[:40]!r} is not a non-negative token count up to {MAX_TOKENS:,}")
    return int(n)


def _pick(keys: dict[str, str], names: tuple[str, ...], what: str, where: str) -> str:
    for n in names:
        if n in keys:
            return keys[n]
    raise TrafficSourceError(f"{where}: no {what} column (expected one of {', '.join(names)}; "
                             f"found {', '.join(keys.values()) or 'none'})")


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
    ts: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    cached: list[int] = []
    cached_col: str | None = None
    stripped = text.lstrip()
    if stripped.startswith("{"):
        cols: tuple[str, str, str] | None = None
        # split on LF only: str.splitlines() would also cut at U+2028 / U+0085 inside a JSON string
        for i, line in enumerate(text.split("\n"), 1):
            line = line.removesuffix("\r")
            if not line.strip():
                continue
            try:
                rec = load_json_text(line, f"{where}:{i}")
            except json.JSONDecodeError as e:
                raise TrafficSourceError(f"{where}:{i}: not a JSON object ({e.msg})") from None
            except ValueError as e:
                raise TrafficSourceError(str(e)) from None
            if not isinstance(rec, dict):
                raise TrafficSourceError(f"{where}:{i}: expected a JSON object per line")
            rec = _flatten_openai(rec)
            if cols is None:
                keys = {k.lower(): k for k in rec}
                cols = (_pick(keys, _TIME, "timestamp", f"{where}:{i}"), _pick(keys, _PROMPT, "prompt tokens", f"{where}:{i}"),
                        _pick(keys, _OUTPUT, "output tokens", f"{where}:{i}"))
                cached_col = next((keys[n] for n in _CACHED if n in keys), None)
            for c in cols:
                if c not in rec:
                    raise TrafficSourceError(f"{where}:{i}: missing field {c!r}")
            ts.append(parse_timestamp_s(rec[cols[0]], f"{where}:{i}"))
            pr.append(_tokens(rec[cols[1]], f"{where}:{i}", cols[1]))
            out.append(_tokens(rec[cols[2]], f"{where}:{i}", cols[2]))
            if cached_col is not None:
                cached.append(min(pr[-1], _tokens(rec.get(cached_col, 0) or 0, f"{where}:{i}", cached_col)))
    elif stripped:
        try:
            return _parse_csv(text, where)
        except csv.Error as e:
            raise TrafficSourceError(f"{where}: not a readable CSV ({e})") from None
    return RequestLog.of(ts, pr, out, where, cached if cached_col is not None else None)


def _parse_csv(text: str, where: str) -> RequestLog:
    """CSV with a header row naming the three columns (any order, extra columns ignored)."""
    ts: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=None))  # universal newlines: CR-only (old Mac) files too
    header = next(reader)
    keys = {h.strip().lower(): str(j) for j, h in enumerate(header)}
    it, ip, io_ = (int(_pick(keys, names, what, f"{where}:1")) for names, what in
                   ((_TIME, "timestamp"), (_PROMPT, "prompt tokens"), (_OUTPUT, "output tokens")))
    for i, row in enumerate(reader, 2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise TrafficSourceError(f"{where}:{i}: expected {len(header)} columns, got {len(row)}")
        ts.append(parse_timestamp_s(row[it], f"{where}:{i}"))
        pr.append(_tokens(row[ip], f"{where}:{i}", header[ip]))
        out.append(_tokens(row[io_], f"{where}:{i}", header[io_]))
    return RequestLog.of(ts, pr, out, where)


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
