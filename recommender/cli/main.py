"""The main job: ``recommend --workload FILE [--slo ...]`` -> ranked Pareto plan (the app's callback)."""

from __future__ import annotations

from typing import List, Optional

import typer

from recommender.cli.app import app, fail, one_line_errors


@app.callback(invoke_without_command=True)
@one_line_errors
def main_job(
    ctx: typer.Context,
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="Workload YAML (see examples/)."),
    slo: List[str] = typer.Option([], "--slo", help="SLO, repeatable: tpot=30ms, ttft=2s@p99, e2e=20s@p90 (units ms/s; percentile p50|p90|p95|p99|mean; default p90). Overrides the file's SLO for that metric."),
) -> None:
    """Plan LLM serving deployments. Without a subcommand: the ranked Pareto plan for --workload."""
    if ctx.invoked_subcommand is not None:
        return
    if workload is None:
        typer.echo(ctx.get_help())
        raise fail("give --workload FILE (e.g. examples/rag.yaml) or a subcommand", 2)
    raise fail("the search is not wired yet", 2)
