"""Pareto-front chart (USD per million tokens vs latency) as a self-contained SVG / HTML page.

No plotting library: a few dozen SVG elements are simpler than a dependency. PNG output uses
matplotlib when it happens to be installed.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

from recommender.plan import Plan
from recommender.search.evaluate import Evaluation


def _points(plan: Plan, evaluations: Sequence[Evaluation], metric: str, pct: str) -> list[tuple[float, float, str, bool]]:
    front = {r.evaluation.candidate.key for r in plan.rows}
    pts = []
    for e in evaluations:
        if not e.feasible:
            continue
        x, y = e.latency(metric, pct), e.usd_per_million_tokens
        if math.isfinite(x) and math.isfinite(y):
            pts.append((x, y, e.candidate.key, e.candidate.key in front))
    return pts


def render_svg(plan: Plan, evaluations: Sequence[Evaluation], width: int = 760, height: int = 460) -> str:
    slo = plan.workload.slos[0] if plan.workload.slos else None
    metric, pct = (slo.metric, slo.percentile) if slo else ("tpot", "p90")
    pts = _points(plan, evaluations, metric, pct)
    if not pts:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="60"><text x="10" y="30">no feasible plans</text></svg>'
    ml, mb, mt, mr = 70, 50, 30, 20
    xs = [p[0] * 1e3 for p in pts]
    ys = [p[1] for p in pts]
    x0, x1 = 0.0, max(xs) * 1.08
    y0, y1 = 0.0, max(ys) * 1.08

    def sx(v: float) -> float:
        return ml + (v - x0) / (x1 - x0 or 1) * (width - ml - mr)

    def sy(v: float) -> float:
        return height - mb - (v - y0) / (y1 - y0 or 1) * (height - mb - mt)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<line x1="{ml}" y1="{height - mb}" x2="{width - mr}" y2="{height - mb}" stroke="black"/>',
           f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{height - mb}" stroke="black"/>',
           f'<text x="{(width + ml) / 2}" y="{height - 12}" text-anchor="middle">{metric.upper()} {pct} (ms)</text>',
           f'<text x="16" y="{(height) / 2}" transform="rotate(-90 16 {height / 2})" text-anchor="middle">USD per million tokens</text>',
           f'<text x="{ml}" y="18">{html.escape(plan.model.id)} / {html.escape(plan.workload.name)}: feasible configurations (grey) and plan rows (blue, ranked)</text>']
    for i in range(6):
        xv = x0 + (x1 - x0) * i / 5
        yv = y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{sx(xv):.1f}" y="{height - mb + 16}" text-anchor="middle">{xv:.0f}</text>')
        out.append(f'<text x="{ml - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
    if slo:
        lx = sx(slo.limit_s * 1e3)
        if lx <= width - mr:
            out.append(f'<line x1="{lx:.1f}" y1="{mt}" x2="{lx:.1f}" y2="{height - mb}" stroke="red" stroke-dasharray="4"/>')
            out.append(f'<text x="{lx + 4:.1f}" y="{mt + 12}" fill="red">SLO {slo.limit_s * 1e3:g} ms</text>')
    for x, y, key, on in sorted(pts, key=lambda p: p[3]):
        color, r = ("#1f6feb", 5) if on else ("#bbbbbb", 3)
        out.append(f'<circle cx="{sx(x * 1e3):.1f}" cy="{sy(y):.1f}" r="{r}" fill="{color}"><title>{html.escape(key)}: '
                   f'{x * 1e3:.1f} ms, ${y:.3f}/M</title></circle>')
    for row in plan.rows:
        e = row.evaluation
        x, y = e.latency(metric, pct), e.usd_per_million_tokens
        if math.isfinite(x) and math.isfinite(y):
            out.append(f'<text x="{sx(x * 1e3) + 7:.1f}" y="{sy(y) - 6:.1f}">#{row.rank} {html.escape(row.label())}</text>')
    out.append("</svg>")
    return "\n".join(out)


def render_html(plan: Plan, evaluations: Sequence[Evaluation]) -> str:
    rows = "".join(f"<tr><td>{r.rank}</td><td>{html.escape(r.label())}</td><td>{r.evaluation.candidate.weight_dtype}</td>"
                   f"<td>${r.evaluation.usd_per_million_tokens:.3f}</td></tr>" for r in plan.rows)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Pareto front: {html.escape(plan.model.id)}</title></head>"
            f"<body style='font-family:sans-serif'>{render_svg(plan, evaluations)}"
            f"<p>{html.escape(plan.why)}</p><table border='1' cellpadding='4'><tr><th>rank</th><th>deployment</th>"
            f"<th>weights</th><th>$/M tokens</th></tr>{rows}</table></body></html>")


def write_plot(path: str, plan: Plan, evaluations: Sequence[Evaluation]) -> None:
    """Write ``path`` as .html, .svg or .png (PNG needs matplotlib)."""
    from recommender.errors import ConfigError

    low = path.lower()
    if low.endswith(".html") or low.endswith(".htm"):
        text = render_html(plan, evaluations)
    elif low.endswith(".svg"):
        text = render_svg(plan, evaluations)
    elif low.endswith(".png"):
        _write_png(path, plan, evaluations)
        return
    else:
        raise ConfigError(f"--plot {path}: use a .html, .svg or .png file name")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _write_png(path: str, plan: Plan, evaluations: Sequence[Evaluation]) -> None:
    from recommender.errors import ConfigError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot *.png needs matplotlib (pip install matplotlib); .html and .svg need nothing") from None
    slo = plan.workload.slos[0] if plan.workload.slos else None
    metric, pct = (slo.metric, slo.percentile) if slo else ("tpot", "p90")
    pts = _points(plan, evaluations, metric, pct)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([p[0] * 1e3 for p in pts if not p[3]], [p[1] for p in pts if not p[3]], c="#bbbbbb", s=10)
    ax.scatter([p[0] * 1e3 for p in pts if p[3]], [p[1] for p in pts if p[3]], c="#1f6feb", s=30)
    ax.set_xlabel(f"{metric.upper()} {pct} (ms)")
    ax.set_ylabel("USD per million tokens")
    fig.savefig(path, dpi=120)
    plt.close(fig)
