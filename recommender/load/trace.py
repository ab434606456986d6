"""Request traces for replay in the simulator: ``(arrival_s, prompt_tokens, output_tokens)`` rows.

Reads CSV with a header. Recognised columns (case-insensitive): arrival time as ``arrival_s`` /
``timestamp_s`` (seconds) or ``TIMESTAMP`` (a date-time like ``2023-11-16 18:15:46.6805900``, as in
the Azure LLM inference traces of the Splitwise paper); prompt tokens as ``prompt_tokens`` /
``ContextTokens`` / ``input_tokens``; output tokens as ``output_tokens`` / ``GeneratedTokens``.
Arrival times are shifted so the first request arrives at 0.
"""

from __future__ import annotations

import csv
import io
import math
from datetime import datetime
from pathlib import Path

from recommender.bounded import read_file_text
from recommender.errors import ConfigError

_ARRIVAL = ("arrival_s", "timestamp_s", "time_s", "timestamp")
_PROMPT = ("prompt_tokens", "contexttokens", "input_tokens", "prompt_len", "input_len")
_OUTPUT = ("output_tokens", "generatedtokens", "output_len", "completion_tokens")


def _seconds(text: str, path: Path, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    s = text.strip()
    if "." in s:  # Python parses at most 6 fractional digits; the Azure traces carry 7
        head, frac = s.split(".", 1)
        s = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        raise ConfigError(f"{path}:{line}: cannot read arrival time {text!r} (seconds or 'YYYY-MM-DD HH:MM:SS.ffffff')") from None


def read_trace(path: str | Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """Rows ``(arrival_s, prompt_tokens, output_tokens)`` sorted by arrival, first arrival at 0 s."""
    p = Path(path)
    with io.StringIO(read_file_text(p, "trace file"), newline="") as fh:
        reader = csv.DictReader(fh)
        cols = {c.strip().lower(): c for c in (reader.fieldnames or [])}

        def pick(names: tuple[str, ...], what: str) -> str:
            for n in names:
                if n in cols:
                    return cols[n]
            raise ConfigError(f"{p}: no {what} column (expected one of {', '.join(names)}); columns: {', '.join(cols.values())}")

        ca, cp, co = pick(_ARRIVAL, "arrival time"), pick(_PROMPT, "prompt tokens"), pick(_OUTPUT, "output tokens")
        rows: list[tuple[float, int, int]] = []
        for i, rec in enumerate(reader, start=2):
            if limit is not None and len(rows) >= limit:
                break
            try:
                prompt, output = int(float(rec[cp])), int(float(rec[co]))
            except (TypeError, ValueError):
                raise ConfigError(f"{p}:{i}: token counts must be numbers, got {rec[cp]!r}, {rec[co]!r}") from None
            t = _seconds(rec[ca], p, i)
            if not math.isfinite(t) or prompt < 0 or output < 0:
                raise ConfigError(f"{p}:{i}: invalid row {rec!r}")
            rows.append((t, max(1, prompt), max(1, output)))
    if not rows:
        raise ConfigError(f"{p}: the trace has no requests")
    rows.sort()
    t0 = rows[0][0]
    return [(t - t0, pr, out) for t, pr, out in rows]
