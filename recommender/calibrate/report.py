"""Render a calibration: the profile YAML document (written atomically), a text report, a JSON report.

The profile YAML keeps the format of ``catalogs/profiles/vllm.yaml`` (``engine``, ``source``,
``parameters``) and adds ``fit``: the data files, row counts, which parameters were fitted / left
unconstrained / ended at a bound, their standard errors (of ln p), and the error before and after the
fit per metric, plus the held-out error. ``recommender.profiles.load_profile`` reads it back.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from tabulate import tabulate

from recommender.atomic import atomic_write_text
from recommender.calibrate.fit import ErrorStats, FamilyReport, FitResult, HeldOut
from recommender.calibrate.measurements import Skip
from recommender.errors import CalibrationError
from recommender.profiles import BOUNDS, MOE_PARAMETERS, EngineProfile, FamilyFit

#: Every numeric profile parameter, in the order of ``catalogs/profiles/vllm.yaml``.
PROFILE_PARAMETERS = (
    "hbm_bandwidth_efficiency", "compute_efficiency", "allreduce_latency_s", "allreduce_latency_pcie_s",
    "allreduce_bandwidth_efficiency", "step_overhead_s", "layer_launch_overhead_s",
    "runtime_reserve_bytes_per_gpu", "cuda_graph_bytes_per_gpu",
)
#: Written only when not zero (older profiles do not have them).
OPTIONAL_PARAMETERS = ("request_overhead_s", "prefill_step_overhead_s", "gemm_m_half_tokens", "moe_layer_overhead_s",
                       "dp_balance_timeout_steps", "expert_bandwidth_efficiency", "layer_overhead_s", "fp8_gemm_efficiency_ratio",
                       "fp4_gemm_efficiency_ratio", "gemm_curve_hidden_fraction", "attention_efficiency_ratio",
                       "server_request_overhead_s", "expert_compute_efficiency", "first_wave_overhead_s")
_DEFAULT = EngineProfile()


def _round(name: str, v: float) -> float:
    """Four significant digits, kept inside the parameter's bounds."""
    r = float(f"{v:.4g}")
    lo, hi = BOUNDS.get(name, (-math.inf, math.inf))
    return min(max(r, lo), hi)


def _stats(d: Mapping[str, ErrorStats]) -> dict[str, dict[str, float]]:
    return {k: v.to_dict() for k, v in d.items()}


def skipped_summary(skipped: Sequence[Skip]) -> dict[str, int]:
    """Reason -> count."""
    out: dict[str, int] = {}
    for s in skipped:
        out[s.reason] = out.get(s.reason, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def skipped_counts(skipped: Sequence[Skip], files: Sequence[str] | None = None) -> dict[str, Any]:
    """What was skipped in the units of the files: ``skipped_rows`` (file -> rows of a CSV), ``skipped_results``
    (file -> `vllm bench serve` results: a JSON file is one, an ``--append-result`` file one per line) and, given
    ``files`` (those that gave rows), ``skipped_files``: the files read that gave none."""
    rows: dict[str, int] = {}
    results: dict[str, int] = {}
    for sk in skipped:
        into = rows if sk.unit == "row" else results
        into[sk.file or "?"] = into.get(sk.file or "?", 0) + 1
    d: dict[str, Any] = {"skipped_rows": rows, "skipped_results": results}
    if files is not None:
        used = set(files)
        d["skipped_files"] = [f for f in dict.fromkeys(sk.file for sk in skipped) if f and f not in used]
    return d


def _n(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def _and(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def skipped_text(skipped: Sequence[Skip], files: Sequence[str]) -> str:
    """"3 rows of results.csv and 2 result files (a.json, b.json)": what was skipped, by file ("" for nothing)."""
    c = skipped_counts(skipped, files)
    whole = set(c["skipped_files"])
    parts = [("all " if f in whole else "") + _n(n, "row") + f" of {f}" for f, n in c["skipped_rows"].items()]
    gone = [f for f in c["skipped_results"] if f in whole]
    if gone:
        names = ", ".join(gone[:3]) + (f", ... {len(gone) - 3} more" if len(gone) > 3 else "")
        parts.append(_n(len(gone), "result file") + f" ({names})")
    parts += [_n(n, "result") + f" of {f}" for f, n in c["skipped_results"].items() if f not in whole]
    return _and(parts) if parts else ""


def fit_summary(res: FitResult, files: Sequence[str] = (), skipped: Sequence[Skip] = (),
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``fit:`` block of a profile (plain data; also the core of the JSON report)."""
    d: dict[str, Any] = {
        "data": list(files),
        "n_rows": res.n_rows,
        **skipped_counts(skipped, files or None),
        "fitted": list(res.fitted),
        "unconstrained": {n: res.unconstrained_reasons.get(n, "") for n in res.unconstrained},
        "at_bound": list(res.at_bound),
        "log_standard_error": {k: round(v, 3) for k, v in res.log_standard_errors.items()},
        "residual_scale": round(res.residual_scale, 4),
        "error_before": _stats(res.before),
        "error_after": _stats(res.after),
        "error_before_by_source": _stats(res.before_by_source),
        "error_after_by_source": _stats(res.after_by_source),
        "held_out": [h.to_dict() for h in res.held_out],
    }
    if skipped:
        d["skipped"] = skipped_summary(skipped)
    if extra:
        d.update(extra)
    return d


def profile_document(profile: EngineProfile, fit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{engine, source, parameters, fit}`` for ``profile`` (parameters rounded to 4 significant digits)."""
    params = {n: _round(n, float(getattr(profile, n))) for n in PROFILE_PARAMETERS}
    params.update({n: _round(n, float(getattr(profile, n))) for n in OPTIONAL_PARAMETERS
                   if getattr(profile, n) != getattr(_DEFAULT, n)})
    doc: dict[str, Any] = {"engine": profile.engine, "source": profile.source, "parameters": params}
    if profile.borrow_model_terms is not None:
        doc["borrow_model_terms"] = profile.borrow_model_terms.to_dict()
    if profile.families:
        doc["families"] = {f.family: _family_doc(f) for f in profile.families}
    if fit:
        doc["fit"] = dict(fit)
    return doc


def _family_doc(f: FamilyFit) -> dict[str, Any]:
    """One ``families:`` entry: :meth:`FamilyFit.to_dict` with its parameters (and its ``releases:`` and ``models:``
    overrides') rounded for the file and the held-out counts as integers."""
    d = f.to_dict()
    for part in [d] + list(d.get("releases", [])):
        part["parameters"] = {n: _round(n, v) for n, v in part["parameters"].items()}
    for part in d.get("models", {}).values():   # per-model overrides: rounded as the family's own
        part["parameters"] = {n: _round(n, v) for n, v in part["parameters"].items()}
    if "held_out_inferencex" in d:
        d["held_out_inferencex"] = {k: int(v) if k in ("rows", "configurations") else v
                                    for k, v in d["held_out_inferencex"].items()}
    return d


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float):
        return None if not math.isfinite(x) else x
    return x


def write_profile(path: str | Path, doc: Mapping[str, Any], header: str = "") -> Path:
    """Write the profile YAML atomically (``recommender.atomic``: temp file, fsync, rename)."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CalibrationError(f"cannot create the folder of --out {p}: {e.strerror}") from None
    text = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    plain = _plain(doc)
    head = {k: v for k, v in plain.items() if k != "fit"}
    text += yaml.safe_dump(head, sort_keys=False, default_flow_style=False, width=110)
    if "fit" in plain:  # leaf mappings ({n, median_ape_pct, p90_ape_pct}) on one line each
        text += yaml.safe_dump({"fit": plain["fit"]}, sort_keys=False, default_flow_style=None, width=130)
    try:
        return atomic_write_text(p, text)
    except OSError as e:
        raise CalibrationError(f"cannot write --out {p}: {e.strerror}") from None


# -- text -------------------------------------------------------------------------------------------
def _fmt(s: ErrorStats | None) -> str:
    if s is None or s.n == 0:
        return "-"
    return f"{s.median_ape:.1f} / {s.p90_ape:.1f}"


def error_table(before: Mapping[str, ErrorStats], after: Mapping[str, ErrorStats], label: str = "metric",
                headers: tuple[str, str] = ("before", "after")) -> str:
    """Rows: group, n, before 'median / p90' APE %, after 'median / p90' APE %."""
    rows = [[k, after[k].n, _fmt(before.get(k)), _fmt(after[k])] for k in after]
    return tabulate(rows, headers=[label, "n", f"{headers[0]} med/p90 %", f"{headers[1]} med/p90 %"],
                    tablefmt="github")


def _fmt_param(name: str, v: float) -> str:
    if name.endswith("_s"):
        return f"{v * 1e6:.4g} us" if v < 1e-3 else f"{v * 1e3:.4g} ms"
    if name.endswith("_bytes_per_gpu"):
        return f"{v / 1e9:.3g} GB"
    return f"{v:.4g}"


def parameter_table(res: FitResult) -> str:
    rows = []
    for n in res.fitted + res.unconstrained:
        se = res.log_standard_errors.get(n)
        status = "fitted" if n in res.fitted else "unconstrained: kept"
        if n in res.at_bound:
            status += ", at bound"
        rows.append([n, _fmt_param(n, getattr(res.start, n)), _fmt_param(n, getattr(res.values, n)),
                     "-" if se is None else f"x/ {math.exp(min(se, 50)):.3g}", status])
    return tabulate(rows, headers=["parameter", "start", "fitted", "1-sigma factor", ""], tablefmt="github")


def held_out_text(h: HeldOut) -> str:
    how = f"{h.folds}-fold over rows" if h.by == "row" else f"leave one {h.by} out, {h.folds} folds"
    title = f"Held-out error ({how}): each group predicted by a fit that did not see it"
    return title + "\n" + error_table(h.before, h.after, headers=("start", "held-out"))


def classes_text(classes: Sequence[Mapping[str, Any]], model: str = "") -> str:
    """The error band plans and estimates made with the profile carry, per evidence class it writes (``fit.classes``;
    docs/bands.md): held-out median APE ``m`` -> log-sd ``m / 0.6745`` shrunk toward the prior, p10-p90 factors."""
    from recommender.search.bands import Z90, held_out_sigma

    rows = []
    for c in classes:
        n, m = int(c["rows"]), float(c["held_out"]["median_ape_pct"])
        sigma = held_out_sigma(n, c["held_out"])
        rows.append([f"{c['engine']}/{c['family']}/{c['dtype']}/{c['model_class']}", n, f"{m:.1f}", f"{sigma:.3f}",
                     f"x{math.exp(-Z90 * sigma):.2f} - x{math.exp(Z90 * sigma):.2f}"])
    scope = f" ({model} only: rows of one configuration)" if model else ""
    return (f"Error band of plans and estimates with this profile{scope}; docs/bands.md\n"
            + tabulate(rows, headers=["class", "rows", "held-out med %", "log-sd", "p10-p90"], tablefmt="github"))


def render_text(res: FitResult, out_path: str | None = None, files: Sequence[str] = (),
                skipped: Sequence[Skip] = (), *, conditions: Sequence[str] = (),
                planner_error: Mapping[str, ErrorStats] | None = None, families: Sequence[FamilyReport] = (),
                classes: Sequence[Mapping[str, Any]] = ()) -> str:
    """The report ``recommend calibrate`` prints."""
    lines = [f"Calibrated profile {res.profile.engine!r} from {res.n_rows} measurements"
             + (f" in {len(files)} file(s)" if files else "")
             + (f"; skipped {skipped_text(skipped, files)}" if skipped else "")]
    for reason in list(skipped_summary(skipped))[:6]:
        units = [sk.unit for sk in skipped if sk.reason == reason]
        counts = [_n(units.count(u), u) for u in ("row", "result") if u in units]
        lines.append(f"  skipped {_and(counts)}: {reason}")
    if conditions:
        lines += ["", "Engine conditions the rows were predicted under"] + [f"  {c}" for c in conditions]
    if families:   # per-family fits: the engine-level values are the start's, each family's are in its table below
        lines += ["", "Parameters: fitted per GPU family (table below); the engine-level values stay the start "
                  "profile's"]
    else:
        lines += ["", "Parameters", parameter_table(res)]
    if res.scope_model and res.fitted:
        lines.append(f"Written as the {res.values.family} family's override for {res.scope_model} only: rows of one "
                     "configuration cannot tell bandwidth, overheads and collectives apart, so other models keep the "
                     "start profile's values.")
    elif res.scope_gpu and res.fitted:
        experts = [n for n in res.fitted if n in MOE_PARAMETERS]
        lines.append(f"Written as the {res.values.family} family's parameters: GPUs of other families keep the start "
                     "profile's values." + (f" The routed experts' terms ({', '.join(experts)}) are written as "
                                            f"{res.experts_model}'s only (families.{res.values.family}.models."
                                            f"{res.experts_model})." if experts and res.experts_model else ""))
    if res.unconstrained:
        lines.append("Unconstrained by these data (kept at the start value):")
        lines += [f"  {n}: {res.unconstrained_reasons.get(n, '')}" for n in res.unconstrained]
    lines += ["", "Error on the fitted rows (absolute % error, median / p90)", error_table(res.before, res.after)]
    for h in res.held_out:
        lines += ["", held_out_text(h)]
    if not res.held_out:
        lines += ["", "Held-out error: needs two sources (files), or 10+ rows for a 5-fold estimate over rows."]
    if families:
        rows = [[f.family, f.rows, f.folds, _fmt(f.engine_error), _fmt(f.family_error),
                 "kept" if f.kept else f"not kept: {f.reason}",
                 ", ".join(f"{n} {_fmt_param(n, v)}" for n, v in f.fitted.items()) if f.kept else "-"]
                for f in families]
        lines += ["", "Per-GPU-family fits (held out within the family)",
                  tabulate(rows, headers=["family", "n", "folds", "engine med/p90 %", "family med/p90 %", "",
                                          "fitted values"], tablefmt="github")]
    if planner_error:
        lines += ["", "Error of the fitted profile under the planner's conditions (vLLM defaults for each GPU, "
                  "gpu-memory-utilization 0.92)", error_table(res.after, dict(planner_error),
                                                              headers=("as run", "planner"))]
    if classes:
        lines += ["", classes_text(classes, res.scope_model)]
    if out_path:
        lines += ["", f"wrote {out_path}  (use it with --profile {out_path})"]
    return "\n".join(lines)


def result_json(res: FitResult, out_path: str | None, files: Sequence[str] = (),
                skipped: Sequence[Skip] = (), extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``--format json`` report: the profile document (``extra``: the rest of its ``fit:`` block, as written to
    the file) plus per-row predictions."""
    doc = profile_document(res.profile, fit_summary(res, files, skipped, extra))
    doc["start_parameters"] = {n: float(getattr(res.start, n)) for n in PROFILE_PARAMETERS}
    doc["out"] = out_path
    doc["rows"] = [{"id": i, "measured": m, "before": b, "after": a} for i, m, b, a in res.predictions]
    return _plain(doc)


__all__ = ["profile_document", "fit_summary", "write_profile", "render_text", "result_json", "error_table",
           "held_out_text", "parameter_table", "skipped_summary", "skipped_counts", "skipped_text", "PROFILE_PARAMETERS"]
