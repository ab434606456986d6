"""Per engine profile and GPU family: the measured rows behind it and their error held out by whole configuration.

    python3 benchmarks/profile_evidence.py

Prints the README's table from the shipped profiles (``catalogs/profiles/*.yaml``), the numbers the fits recorded:

- dense rows: ``fit.held_out_by_config.by_family`` (``benchmarks/fit_profiles.py`` on ``published.csv`` and
  ``amd-mi300x.csv``): rows, configurations, median absolute % error of the row's quantity, held out;
- InferenceX DeepSeek-R1 rows: ``families.<f>.held_out_inferencex`` (``benchmarks/fit_inferencex.py``): rows,
  configurations, TTFT / TPOT / output throughput mean absolute % error, held out.

``tests/test_profile_evidence.py`` checks that the README carries this table as printed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from recommender.profiles import engine_profile, profile_dir  # noqa: E402

HEAD = ["| engine | family | dense rows (configurations) | dense held out, median % | InferenceX rows (configurations) "
        "| InferenceX held out TTFT / TPOT / tok/s % |", "|---|---|---|---:|---|---|"]


Evidence = Mapping[str, Mapping[str, Mapping[str, Any]]]


def table(dense: Evidence | None = None, moe: Evidence | None = None) -> list[str]:
    """One row per (engine, family) with measured rows of either kind, engines and families in name order. The
    figures are those the profiles record, or, where given, ``dense`` / ``moe`` (engine -> family -> the same keys:
    ``benchmarks/readme_figures.py`` passes them recomputed from the rows)."""
    out = list(HEAD)
    for engine in sorted(p.stem for p in profile_dir().glob("*.yaml")):
        prof = engine_profile(engine)
        block = (prof.fit or {}).get("held_out_by_config") or {}
        recorded = dict(block.get("by_family") or {}) if isinstance(block, dict) else {}
        dense_of = dict(dense.get(engine) or {}) if dense is not None else recorded
        moe_of = (dict(moe.get(engine) or {}) if moe is not None else
                  {f.family: dict(f.held_out_inferencex) for f in prof.families if f.held_out_inferencex})
        out += _engine_lines(engine, dense_of, moe_of)
    return out


def _engine_lines(engine: str, dense: Mapping[str, Mapping[str, Any]], moe: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The table's lines of one engine, a family per line."""
    out = []
    for fam in sorted(set(dense) | set(moe)):
        d, m = dense.get(fam) or {}, moe.get(fam) or {}
        dcells = (f"{int(d['rows'])} ({int(d['configurations'])})", f"{float(d['median_ape_pct']):.1f}") if d else ("-", "-")
        mcells = ((f"{int(m['rows'])} ({int(m['configurations'])})",
                   f"{m['ttft_mape_pct']:.1f} / {m['tpot_mape_pct']:.1f} / {m['output_tput_mape_pct']:.1f}")
                  if m else ("-", "-"))
        out.append(f"| {engine} | {fam} | {dcells[0]} | {dcells[1]} | {mcells[0]} | {mcells[1]} |")
    return out


if __name__ == "__main__":
    print("\n".join(table()))
