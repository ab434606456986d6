"""``--plot FILE``: the Pareto chart alone (the same plotly figure the ``--report`` page embeds).

``.html``: a self-contained page (plotly's JS inlined, no network). ``.svg`` / ``.png``: plotly's static
export, which needs the optional kaleido package (and a Chrome/Chromium it drives); the CLI checks for it
before the search starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from recommender.atomic import atomic_write_bytes, atomic_write_text
from recommender.errors import ConfigError
from recommender.plan import Plan
from recommender.render.figure import pareto_figure
from recommender.search.evaluate import Evaluation


def render_chart_html(plan: Plan, evaluations: Sequence[Evaluation] | None = None) -> str:
    """A chart-only HTML page with plotly's JS inlined."""
    fig = pareto_figure(plan, evaluations)
    page: str = fig.to_html(full_html=True, include_plotlyjs=True, div_id="pareto", config={"displaylogo": False})
    return page


def write_plot(path: str, plan: Plan, evaluations: Sequence[Evaluation] | None = None) -> None:
    """Write the chart to ``path`` (.html, .svg or .png) atomically (:mod:`recommender.atomic`): the image is
    rendered in memory first, so a failed export or a killed run leaves the old file or none, never part of one."""
    suffix = Path(path).suffix.lower()
    if suffix in (".html", ".htm"):
        atomic_write_text(Path(path), render_chart_html(plan, evaluations))
    elif suffix in (".svg", ".png"):
        try:
            data: bytes = pareto_figure(plan, evaluations).to_image(format=suffix[1:])
        except (ImportError, ValueError, RuntimeError) as e:
            raise ConfigError(f"--plot {path}: static export failed ({str(e).splitlines()[0]}); "
                              "it needs kaleido and Chrome/Chromium; .html needs nothing") from None
        atomic_write_bytes(Path(path), data)
    else:
        raise ConfigError(f"--plot {path}: use a .html, .svg or .png file name")
