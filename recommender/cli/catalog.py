"""``recommend models`` and ``recommend gpus``: what the catalog knows, and the names each answers to."""

from __future__ import annotations

import typer

from recommender.cli import options
from recommender.cli.app import app, one_line_errors
from recommender.errors import ConfigError

_FORMATS = ("table", "json")


def _check(fmt: str) -> None:
    if fmt not in _FORMATS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(_FORMATS)}")


@app.command("models")
@one_line_errors
def models_cmd(fmt: str = typer.Option("table", "--format", "-f", help="table|json"), wide: options.Wide = False) -> None:
    """List catalog models: id, Hugging Face repo, parameters, context length."""
    from recommender.catalog import default_catalog
    from recommender.render.catalog import render_models

    _check(fmt)
    typer.echo(render_models(default_catalog(), fmt=fmt, width=None if wide else options.fitted_width()))


@app.command("gpus")
@one_line_errors
def gpus_cmd(fmt: str = typer.Option("table", "--format", "-f", help="table|json"), wide: options.Wide = False) -> None:
    """List catalog GPUs: memory, bandwidth, peak per dtype, interconnect, price, aliases."""
    from recommender.catalog import default_catalog
    from recommender.render.catalog import render_gpus

    _check(fmt)
    typer.echo(render_gpus(default_catalog(), fmt=fmt, width=None if wide else options.fitted_width()))
