"""The one reader for request traces and request logs: one request per line, CSV with a header or JSONL.

Columns (case-insensitive, first match wins, extra columns ignored):

- time: ``arrival_s``, ``timestamp_s``, ``time_s``, ``timestamp`` (the Azure traces' ``TIMESTAMP``),
  ``time``, ``ts``, ``arrival_time``, ``created``;
- prompt tokens: ``prompt_tokens``, ``ContextTokens`` (Azure), ``input_tokens``, ``prompt_len``, ``input_len``;
- output tokens: ``output_tokens``, ``GeneratedTokens`` (Azure), ``completion_tokens``, ``output_len``;
- optional prompt tokens served from a prefix cache: ``cached_tokens``, ``CachedTokens``, ``prefix_cached_tokens``.

JSONL in the OpenAI response shape is read too: ``{"created": 1700000000, "usage": {"prompt_tokens": ..,
"completion_tokens": .., "prompt_tokens_details": {"cached_tokens": ..}}}``, also wrapped as a Batch API
output line (``{"response": {"body": {...}}}``).

Timestamps are numbers (unix or relative seconds; values above 1e11 are milliseconds) or ISO 8601 date-times
(naive = UTC; more than 6 fractional digits, as in the Azure LLM inference traces of the Splitwise paper,
are cut to microseconds), from 1970 to 2100. Token counts are non-negative numbers up to 10,000,000.

:func:`parse_requests` is the parser (the re-planner's request logs use it with their own error type);
:func:`read_trace` reads a file for replay in the simulator: rows ``(arrival_s, prompt_tokens, output_tokens)``
sorted by arrival, the first at 0 s, token counts at least 1.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from recommender.bounded import load_json_text, read_file_text
from recommender.errors import ConfigError, RecommenderError
from recommender.units import MAX_UNIX_S
from recommender.workload import MAX_TOKENS

TIME_COLUMNS = ("arrival_s", "timestamp_s", "time_s", "timestamp", "time", "ts", "arrival_time", "created")
PROMPT_COLUMNS = ("prompt_tokens", "contexttokens", "input_tokens", "prompt_len", "input_len")
OUTPUT_COLUMNS = ("output_tokens", "generatedtokens", "completion_tokens", "output_len")
CACHED_COLUMNS = ("cached_tokens", "cachedtokens", "prefix_cached_tokens")
#: epoch numbers above this are milliseconds (1e11 s is the year 5138)
MILLISECONDS_ABOVE = 1e11


@dataclass(frozen=True)
class ParsedRequests:
    """Requests in file order: times (s), token counts, and prompt tokens served from a prefix cache
    (``None`` when the file has no cached-tokens column; each value at most its prompt)."""

    timestamps_s: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    cached_tokens: list[int] | None = None


def parse_timestamp_s(value: object, where: str, error: type[RecommenderError] = ConfigError) -> float:
    """A number (seconds; above 1e11: milliseconds) or an ISO 8601 date-time (naive = UTC) -> seconds,
    from 0 (a relative trace's start) to 2100-01-01 (``units.MAX_UNIX_S``)."""
    if isinstance(value, bool) or value is None:
        raise error(f"{where}: missing or invalid timestamp {value!r}")
    if isinstance(value, (int, float)):
        x = float(value)
    else:
        s = str(value).strip()
        try:
            x = float(s)
        except ValueError:
            return _sane_time(_iso_s(s, where, error), value, where, error)
    if not math.isfinite(x):
        raise error(f"{where}: timestamp {value!r} is not finite")
    return _sane_time(x / 1000.0 if x > MILLISECONDS_ABOVE else x, value, where, error)


def _iso_s(s: str, where: str, error: type[RecommenderError]) -> float:
    head, dot, frac = s.partition(".")
    if dot:  # at most 6 fractional digits (microseconds); a zone suffix is kept
        digits = len(frac) - len(frac.lstrip("0123456789"))
        s = f"{head}.{frac[:min(digits, 6)]}{frac[digits:]}"
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise error(f"{where}: cannot read timestamp {s[:40]!r} (use seconds or ISO 8601 like "
                    f"2023-11-16 18:15:46.68)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _sane_time(t: float, value: object, where: str, error: type[RecommenderError]) -> float:
    if not 0 <= t <= MAX_UNIX_S:
        raise error(f"{where}: timestamp {str(value)[:40]!r} is {t:.4g} s, outside 0..{MAX_UNIX_S:.0f} s "
                    f"(1970 to 2100); give unix seconds, milliseconds or ISO 8601")
    return t


def _tokens(value: object, where: str, column: str, error: type[RecommenderError]) -> int:
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise error(f"{where}: {column} {str(value)[:40]!r} is not a token count") from None
    if not math.isfinite(n) or n < 0 or n > MAX_TOKENS:
        raise error(f"{where}: {column} {str(value)[:40]!r} is not a non-negative token count up to {MAX_TOKENS:,}")
    return int(n)


def _pick(keys: dict[str, str], names: tuple[str, ...], what: str, where: str, error: type[RecommenderError],
          found: list[str] | None = None) -> str:
    """``keys[n]`` for the first of ``names`` in ``keys`` (lower-cased column -> what the caller needs of it), else
    one line naming the columns the file has (``found``, as written; default: ``keys``' values)."""
    for n in names:
        if n in keys:
            return keys[n]
    raise error(f"{where}: no {what} column (expected one of {', '.join(names)}; found "
                f"{_column_list(list(keys.values()) if found is None else found)})")


def _column_list(columns: list[str], most: int = 12) -> str:
    """Column names for a message: each quoted when blank or odd, at most 40 characters, at most ``most`` of them."""
    shown = [c if c and c.isprintable() and c.strip() == c and "," not in c and len(c) <= 40 else repr(c[:40])
             for c in columns[:most]]
    more = f" and {len(columns) - most} more" if len(columns) > most else ""
    return ", ".join(shown) + more if shown else "none"


def flatten_openai(rec: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI response (or Batch API output line, ``{"response": {"body": {...}}}``) as flat columns:
    ``usage.prompt_tokens`` / ``completion_tokens`` / ``prompt_tokens_details.cached_tokens`` (or the
    Responses API's ``input_tokens`` / ``output_tokens``); other records unchanged."""
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


def parse_requests(text: str, where: str, *, error: type[RecommenderError] = ConfigError,
                   limit: int | None = None) -> ParsedRequests:
    """Requests in file order: JSONL when the first non-blank character is ``{``, else CSV with a header
    row. At most ``limit`` requests. Every problem is one ``error`` line naming ``where:line``."""
    if text.lstrip().startswith("{"):
        return _parse_jsonl(text, where, error, limit)
    try:
        return _parse_csv(text, where, error, limit)
    except csv.Error as e:
        raise error(f"{where}: not a readable CSV ({e})") from None


def _parse_jsonl(text: str, where: str, error: type[RecommenderError], limit: int | None) -> ParsedRequests:
    ts: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    cached: list[int] = []
    cols: tuple[str, str, str] | None = None
    cached_col: str | None = None
    # split on LF only: str.splitlines() would also cut at U+2028 / U+0085 inside a JSON string
    for i, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if limit is not None and len(ts) >= limit:
            break
        at = f"{where}:{i}"
        try:
            rec = load_json_text(line, at)
        except json.JSONDecodeError as e:
            raise error(f"{at}: not a JSON object ({e.msg})") from None
        except ValueError as e:
            raise error(str(e)) from None
        if not isinstance(rec, dict):
            raise error(f"{at}: expected a JSON object per line")
        rec = flatten_openai(rec)
        if cols is None:
            keys = {k.lower(): k for k in rec}
            cols = (_pick(keys, TIME_COLUMNS, "timestamp", at, error), _pick(keys, PROMPT_COLUMNS, "prompt tokens", at, error),
                    _pick(keys, OUTPUT_COLUMNS, "output tokens", at, error))
            cached_col = next((keys[n] for n in CACHED_COLUMNS if n in keys), None)
        for c in cols:
            if c not in rec:
                raise error(f"{at}: missing field {c!r}")
        ts.append(parse_timestamp_s(rec[cols[0]], at, error))
        pr.append(_tokens(rec[cols[1]], at, cols[1], error))
        out.append(_tokens(rec[cols[2]], at, cols[2], error))
        if cached_col is not None:
            cached.append(min(pr[-1], _tokens(rec.get(cached_col, 0) or 0, at, cached_col, error)))
    return ParsedRequests(ts, pr, out, cached if cached_col is not None else None)


def _parse_csv(text: str, where: str, error: type[RecommenderError], limit: int | None) -> ParsedRequests:
    ts: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=None))  # universal newlines: CR-only (old Mac) files too
    header = next(reader, None)
    if header is None:
        return ParsedRequests(ts, pr, out)
    keys = {h.strip().lower(): str(j) for j, h in enumerate(header)}  # column name -> its index
    it, ip, io_ = (int(_pick(keys, names, what, f"{where}:1", error, found=header)) for names, what in
                   ((TIME_COLUMNS, "timestamp"), (PROMPT_COLUMNS, "prompt tokens"), (OUTPUT_COLUMNS, "output tokens")))
    for i, row in enumerate(reader, 2):
        if not row or not any(c.strip() for c in row):
            continue
        if limit is not None and len(ts) >= limit:
            break
        if len(row) < len(header):
            raise error(f"{where}:{i}: expected {len(header)} columns, got {len(row)}")
        ts.append(parse_timestamp_s(row[it], f"{where}:{i}", error))
        pr.append(_tokens(row[ip], f"{where}:{i}", header[ip], error))
        out.append(_tokens(row[io_], f"{where}:{i}", header[io_], error))
    return ParsedRequests(ts, pr, out)


def read_trace(path: str | Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """Rows ``(arrival_s, prompt_tokens, output_tokens)`` sorted by arrival, first arrival at 0 s, tokens >= 1."""
    p = Path(path)
    parsed = parse_requests(read_file_text(p, "trace file"), str(p), limit=limit)
    ts, pr, out = parsed.timestamps_s, parsed.prompt_tokens, parsed.output_tokens
    if not ts:
        raise ConfigError(f"{p}: the trace has no requests")
    rows = sorted(zip(ts, (max(1, n) for n in pr), (max(1, n) for n in out)))
    t0 = rows[0][0]
    return [(t - t0, prompt, output) for t, prompt, output in rows]
