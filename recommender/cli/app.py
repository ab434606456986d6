"""The typer application every command module registers on, and the one-line error handler."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import typer

from recommender.errors import RecommenderError

app = typer.Typer(
    name="recommend",
    help="Plan LLM serving deployments: ranked Pareto plans with $/M tokens, estimates, vLLM deployment files.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, exit_code: int = 2) -> "typer.Exit":
    """Print one line to stderr and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(exit_code)


def one_line_errors(func: F) -> F:
    """Turn RecommenderError (and stray OSError/ValueError from user input) into one line + non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except RecommenderError as e:
            raise fail(str(e).replace("\n", " "), e.exit_code) from None
        except FileNotFoundError as e:
            raise fail(f"file not found: {e.filename}", 2) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
