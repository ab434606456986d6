"""The one reader for request traces and request logs: one request per line, CSV with a header or JSONL.

Columns (case-insensitive, first match wins, extra columns ignored):

- time: ``arrival_s``, ``timestamp_s``, ``time_s``, ``timestamp`` (the Azure traces' ``TIMESTAMP``),
  ``time``, ``ts``, ``arrival_time``, ``created``;
- prompt tokens: ``prompt_tokens``, ``ContextTokens`` (Azure), ``input_tokens``, ``prompt_len``, ``input_len``;
- output tokens: ``output_tokens``, ``GeneratedTokens`` (Azure), ``completion_tokens``, ``output_len``.

Timestamps are numbers (unix or relative seconds; values above 1e11 are milliseconds) or ISO 8601 date-times
(naive = UTC; more than 6 fractional digits, as in the Azure LLM inference traces of the Splitwise paper,
are cut to microseconds). Token counts are non-negative numbers.

:func:`parse_requests` is the parser (the re-planner's request logs use it with their own error type);
:func:`read_trace` reads a file for replay in the simulator: rows ``(arrival_s, prompt_tokens, output_tokens)``
sorted by arrival, the first at 0 s, token counts at least 1.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path

from recommender.bounded import load_json_text, read_file_text
from recommender.errors import ConfigError, RecommenderError

TIME_COLUMNS = ("arrival_s", "timestamp_s", "time_s", "timestamp", "time", "ts", "arrival_time", "created")
PROMPT_COLUMNS = ("prompt_tokens", "contexttokens", "input_tokens", "prompt_len", "input_len")
OUTPUT_COLUMNS = ("output_tokens", "generatedtokens", "completion_tokens", "output_len")
#: epoch numbers above this are milliseconds (1e11 s is the year 5138)
MILLISECONDS_ABOVE = 1e11

Requests = tuple[list[float], list[int], list[int]]


def parse_timestamp_s(value: object, where: str, error: type[RecommenderError] = ConfigError) -> float:
    """A number (seconds; above 1e11: milliseconds) or an ISO 8601 date-time (naive = UTC) -> seconds."""
    if isinstance(value, bool) or value is None:
        raise error(f"{where}: missing or invalid timestamp {value!r}")
    if isinstance(value, (int, float)):
        x = float(value)
    else:
        s = str(value).strip()
        try:
            x = float(s)
        except ValueError:
            head, dot, frac = s.partition(".")
            if dot:  # at most 6 fractional digits (microseconds); a zone suffix is kept
                digits = len(frac) - len(frac.lstrip("0123456789"))
                s = f"{head}.{frac[:min(digits, 6)]}{frac[digits:]}"
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
            except ValueError:
                raise error(f"{where}: cannot read timestamp {str(value)!r} (use seconds or ISO 8601 like "
                            f"2023-11-16 18:15:46.68)") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            return dt.timestamp()
    if not math.isfinite(x):
        raise error(f"{where}: timestamp {value!r} is not finite")
    return x / 1000.0 if x > MILLISECONDS_ABOVE else x


def _tokens(value: object, where: str, column: str, error: type[RecommenderError]) -> int:
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise error(f"{where}: {column} {value!r} is not a token count") from None
    if not math.isfinite(n) or n < 0:
        raise error(f"{where}: {column} {value!r} is not a non-negative token count")
    return int(n)


def _pick(keys: dict[str, str], names: tuple[str, ...], what: str, where: str, error: type[RecommenderError]) -> str:
    for n in names:
        if n in keys:
            return keys[n]
    raise error(f"{where}: no {what} column (expected one of {', '.join(names)}; found "
                f"{', '.join(keys.values()) or 'none'})")


def parse_requests(text: str, where: str, *, error: type[RecommenderError] = ConfigError,
                   limit: int | None = None) -> Requests:
    """(timestamps_s, prompt_tokens, output_tokens) in file order: JSONL when the first non-blank
    character is ``{``, else CSV with a header row. At most ``limit`` requests."""
    if text.lstrip().startswith("{"):
        return _parse_jsonl(text, where, error, limit)
    try:
        return _parse_csv(text, where, error, limit)
    except csv.Error as e:
        raise error(f"{where}: not a readable CSV ({e})") from None


def _parse_jsonl(text: str, where: str, error: type[RecommenderError], limit: int | None) -> Requests:
    ts: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    cols: tuple[str, str, str] | None = None
    for i, line in enumerate(text.splitlines(), 1):
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
        if cols is None:
            keys = {k.lower(): k for k in rec}
            cols = (_pick(keys, TIME_COLUMNS, "timestamp", at, error), _pick(keys, PROMPT_COLUMNS, "prompt tokens", at, error),
                    _pick(keys, OUTPUT_COLUMNS, "output tokens", at, error))
        for c in cols:
            if c not in rec:
                raise error(f"{at}: missing field {c!r}")
        ts.append(parse_timestamp_s(rec[cols[0]], at, error))
        pr.append(_tokens(rec[cols[1]], at, cols[1], error))
        out.append(_tokens(rec[cols[2]], at, cols[2], error))
    return ts, pr, out


def _parse_csv(text: str, where: str, error: type[RecommenderError], limit: int | None) -> Requests:
    ts: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        return ts, pr, out
    keys = {h.strip().lower(): str(j) for j, h in enumerate(header)}
    it, ip, io_ = (int(_pick(keys, names, what, f"{where}:1", error)) for names, what in
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
    return ts, pr, out


def read_trace(path: str | Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """Rows ``(arrival_s, prompt_tokens, output_tokens)`` sorted by arrival, first arrival at 0 s, tokens >= 1."""
    p = Path(path)
    ts, pr, out = parse_requests(read_file_text(p, "trace file"), str(p), limit=limit)
    if not ts:
        raise ConfigError(f"{p}: the trace has no requests")
    rows = sorted(zip(ts, (max(1, n) for n in pr), (max(1, n) for n in out)))
    t0 = rows[0][0]
    return [(t - t0, prompt, output) for t, prompt, output in rows]
