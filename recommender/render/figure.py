"""The one Pareto chart (plotly): USD per million tokens against each SLO metric, used by ``--report``
(inside the page) and by ``--plot`` (chart-only HTML, or SVG/PNG through kaleido).

One panel per SLO metric (rank 1's binding metric first; TTFT and TPOT at p90 when there is no SLO).
In each panel: every feasible configuration the search evaluated (grey, hover for details), the Pareto
front of cost against that metric (line), one point per ranked plan (labelled ``#rank``), and the SLO
limit (dashed line, labelled inside the plot area). The cost axis is logarithmic: the search's feasible
configurations span orders of magnitude in $/M tokens while the ranked plans sit at the bottom.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from recommender.plan import Plan, PlanRow
from recommender.search.evaluate import Evaluation
from recommender.units import fmt_seconds

#: Trace names the browser test and readers rely on.
PLANS_TRACE = "ranked plans"
RANK1_TRACE = "rank 1"
MAX_GREY_POINTS = 3000  # cheapest feasible configurations drawn per panel (SVG stays light)
_LABEL_RADIUS_PX = 38
_LABEL_DIRECTIONS = tuple((math.cos(math.radians(a)), -math.sin(math.radians(a))) for a in (45, -45, 135, -135, 90, -90, 0, 180))


def chart_metrics(plan: Plan) -> list[tuple[str, str, float | None]]:
    """(metric, percentile, limit_s or None) per panel: every SLO, the one binding rank 1 first."""
    slos = list(plan.slos)
    if not slos:
        return [("ttft", "p90", None), ("tpot", "p90", None)]
    binding = plan.rows[0].binding.split("@")[0] if plan.rows else ""
    slos.sort(key=lambda s: s.metric != binding)
    return [(s.metric, s.percentile, s.limit_s) for s in slos]


def _hover(e: Evaluation, label: str) -> str:
    return _hover_text(label, e.gpus_total, e.candidate.weight_dtype, e.candidate.kv_dtype, e.usd_per_million_tokens,
                       e.usd_per_hour, e.latencies, e.binding)


def _row_hover(r: PlanRow, label: str) -> str:
    return _hover_text(label, r.gpus_total, r.weight_dtype, r.kv_dtype, r.usd_per_million_tokens or math.inf,
                       r.usd_per_hour or math.inf, r.latency_percentiles, r.binding)


def _hover_text(label: str, gpus: int, wd: str, kd: str, usd_m: float, usd_h: float,
                lat: Mapping[str, Mapping[str, float]], binding: str) -> str:
    parts = [f"<b>{label}</b>", f"{gpus} GPUs, {wd}/{kd}", f"${usd_m:.3f}/M tokens, ${usd_h:,.2f}/h"]
    for m in ("ttft", "tpot", "e2e"):
        if m in lat and "p90" in lat[m]:
            parts.append(f"{m.upper()} p90 {fmt_seconds(lat[m]['p90'])}")
    parts.append(f"binding: {binding}")
    return "<br>".join(parts)


def _front(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Pareto front (lowest cost for at most that latency), as a step line."""
    xs: list[float] = []
    ys: list[float] = []
    best = math.inf
    for x, y in sorted(points):
        if y < best:
            if xs:
                xs.append(x)
                ys.append(best)
            xs.append(x)
            ys.append(y)
            best = y
    return xs, ys


def _label_offsets(xy: Sequence[tuple[float, float]], x_max: float, y_log_range: tuple[float, float],
                   width_px: float, height_px: float) -> list[tuple[float, float]]:
    """Pixel offsets (ax, ay) for each point's label: of eight directions, the one farthest from every
    point and every label already placed (greedy, in rank order), so close plans keep apart labels."""
    lo, hi = y_log_range
    px = [(x / (x_max or 1.0) * width_px, -(math.log10(y) - lo) / ((hi - lo) or 1.0) * height_px) for x, y in xy]
    taken = list(px)
    out = []
    for x, y in px:
        def clearance(d: tuple[float, float], x: float = x, y: float = y) -> float:
            lx, ly = x + d[0] * _LABEL_RADIUS_PX, y + d[1] * _LABEL_RADIUS_PX
            return min((math.hypot(lx - tx, ly - ty) for tx, ty in taken if (tx, ty) != (x, y)), default=math.inf)

        d = max(_LABEL_DIRECTIONS, key=clearance)
        taken.append((x + d[0] * _LABEL_RADIUS_PX, y + d[1] * _LABEL_RADIUS_PX))
        out.append((d[0] * _LABEL_RADIUS_PX, d[1] * _LABEL_RADIUS_PX))
    return out


def dollar_ticks(lo_usd: float, hi_usd: float) -> list[float]:
    """Tick values for a log cost axis: 1, 2 and 5 x 10^k inside [lo_usd, hi_usd] (every decade labelled and two
    steps between; with under three such values in range, 1-9 x 10^k)."""
    if not (math.isfinite(lo_usd) and math.isfinite(hi_usd)) or lo_usd <= 0 or hi_usd <= lo_usd:
        return []
    decades = range(math.floor(math.log10(lo_usd)), math.ceil(math.log10(hi_usd)) + 1)
    for steps in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [round(m * 10.0 ** k, 12) for k in decades for m in steps if lo_usd <= m * 10.0 ** k <= hi_usd]
        if len(ticks) >= 3:
            return ticks
    return ticks


def fmt_usd_tick(usd: float) -> str:
    """'$0.02', '$0.5', '$1', '$20', '$1,000': as few digits as the value needs."""
    if usd >= 1:
        return f"${usd:,.0f}"
    return "$" + f"{usd:.6f}".rstrip("0").rstrip(".")


def pareto_figure(plan: Plan, evaluations: Sequence[Evaluation] | None = None) -> Any:
    """The plotly Figure (one panel per metric of :func:`chart_metrics`)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    evaluations = plan.evaluations if evaluations is None else evaluations
    panels = chart_metrics(plan)
    titles = [f"{m.upper()} {p}" + (f" (SLO {fmt_seconds(lim)})" if lim else "") for m, p, lim in panels]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles, shared_yaxes=True,
                        horizontal_spacing=0.06)
    feasible = [e for e in evaluations if e.feasible and math.isfinite(e.usd_per_million_tokens)]
    feasible.sort(key=lambda e: e.usd_per_million_tokens)
    grey = feasible[:MAX_GREY_POINTS]
    costs = [r.usd_per_million_tokens for r in plan.rows if r.usd_per_million_tokens] or [e.usd_per_million_tokens for e in grey] or [1.0]
    y_range = (math.log10(min(costs) * 0.6), math.log10(max(costs) * 6))  # zoomed on the plans; the toolbar zooms out
    for col, (metric, pct, limit) in enumerate(panels, start=1):
        first = col == 1
        pts = [(e.latency(metric, pct) * 1e3, e.usd_per_million_tokens, e) for e in grey
               if math.isfinite(e.latency(metric, pct))]
        fig.add_trace(go.Scatter(
            x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name="feasible configurations",
            legendgroup="feasible", showlegend=first, marker={"color": "#c8c8c8", "size": 5},
            hovertemplate="%{customdata}<extra></extra>",
            customdata=[_hover(p[2], p[2].candidate.key) for p in pts]), row=1, col=col)
        fx, fy = _front([(p[0], p[1]) for p in pts])
        fig.add_trace(go.Scatter(x=fx, y=fy, mode="lines", name="Pareto front", legendgroup="front",
                                 showlegend=first, line={"color": "#8c96a0", "width": 1.5, "shape": "linear"},
                                 hoverinfo="skip"), row=1, col=col)
        rows = [r for r in plan.rows if math.isfinite(r.latency(metric, pct))]
        fig.add_trace(go.Scatter(
            x=[r.latency(metric, pct) * 1e3 for r in rows],
            y=[(r.usd_per_million_tokens or math.inf) for r in rows],
            mode="markers", name=PLANS_TRACE, legendgroup="plans", showlegend=first,
            marker={"color": "#1f6feb", "size": 11, "symbol": "circle", "line": {"color": "white", "width": 1}},
            hovertemplate="%{customdata}<extra></extra>",
            customdata=[_row_hover(r, f"#{r.rank} {r.label()}") for r in rows]), row=1, col=col)
        best = [r for r in rows if r.rank == 1]  # drawn over its circle, in a legend entry of its own
        fig.add_trace(go.Scatter(
            x=[r.latency(metric, pct) * 1e3 for r in best], y=[(r.usd_per_million_tokens or math.inf) for r in best],
            mode="markers", name=RANK1_TRACE, legendgroup="rank1", showlegend=first and bool(best),
            marker={"color": "#0b3d91", "size": 17, "symbol": "star", "line": {"color": "white", "width": 1}},
            hoverinfo="skip"), row=1, col=col)
        xs = [p[0] for p in pts] + [r.latency(metric, pct) * 1e3 for r in rows]
        hi = max(xs + ([limit * 1e3] if limit else []), default=1.0)
        fig.update_xaxes(title_text=f"{metric.upper()} {pct} (ms)", range=[0, hi * 1.08], row=1, col=col)
        axis = "" if col == 1 else str(col)
        xy = [(r.latency(metric, pct) * 1e3, (r.usd_per_million_tokens or math.inf)) for r in rows]
        for r, (x, y), (ax, ay) in zip(rows, xy, _label_offsets(xy, hi * 1.08, y_range, 480, 350)):
            fig.add_annotation(x=x, y=math.log10(y), xref=f"x{axis}", yref=f"y{axis}", text=f"#{r.rank}",
                               showarrow=True, arrowhead=0, arrowcolor="#0b3d91", ax=ax, ay=ay,
                               font={"size": 13, "color": "#0b3d91"}, bgcolor="rgba(255,255,255,0.85)")
        if limit:
            fig.add_vline(x=limit * 1e3, line={"color": "#d1242f", "dash": "dash", "width": 1.5}, row=1, col=col)
            fig.add_annotation(x=limit * 1e3, y=1, xref=f"x{axis}", yref=f"y{axis} domain",
                               text=f"SLO {fmt_seconds(limit)}", showarrow=False, xanchor="right", yanchor="top",
                               font={"color": "#d1242f"}, bgcolor="rgba(255,255,255,0.8)")
    tick_usd = dollar_ticks(10 ** y_range[0], 10 ** y_range[1])
    fig.update_yaxes(type="log", range=list(y_range), tickvals=tick_usd, ticktext=[fmt_usd_tick(v) for v in tick_usd])
    fig.update_yaxes(title_text="USD per million tokens (log scale)", row=1, col=1)
    w = plan.workload
    fig.update_layout(
        # Plotly renders a subset of HTML in text (<a href>, <i>, <span style>): the user's names go in as entities
        title={"text": f"{html.escape(w.model)} / {html.escape(w.name)}: cost against each SLO metric", "x": 0.01},
        template="plotly_white", height=520, width=max(640, 560 * len(panels)),
        legend={"orientation": "h", "y": -0.18}, margin={"l": 70, "r": 30, "t": 80, "b": 90},
        hoverlabel={"align": "left"},
    )
    return fig
