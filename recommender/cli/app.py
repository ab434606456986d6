"""The typer application every command module registers on, and the one-line error handler."""

from __future__ import annotations

import copy
import functools
import os
import sys
from typing import Any, Callable, TypeVar

import typer
import typer.core
from typer._click.exceptions import ClickException, UsageError  # typer >= 0.29 vendors click; no public alias

from recommender.errors import RecommenderError

class _UsageLine(ClickException):
    """A usage mistake (unknown option or command, missing option, extra argument) as one line on stderr, exit 2."""

    exit_code = 2

    def __init__(self, message: str, command_path: str) -> None:
        super().__init__(message)
        self.command_path = command_path

    def show(self, file: Any = None) -> None:
        typer.echo(f"error: {one_line(self.message.rstrip('.'))}; see '{self.command_path} -h'", err=True)


def _apply_global(name: str) -> Callable[[Any, Any, Any], None]:
    """The callback of a global option given after the subcommand: what the main callback does with it."""

    def apply(ctx: Any, param: Any, value: Any) -> None:
        if not value:  # the main callback already applied the command line's setting before the subcommand
            return
        if name == "quiet":
            from recommender import progress

            progress.configure(quiet=True)
        elif name == "debug":
            set_debug(True)
        elif name == "wide":
            from recommender.cli.options import set_wide

            set_wide(True)

    return apply


#: the main command's options that apply to any command (``--quiet``, ``--debug``, ``--wide``): accepted before
#: the subcommand (``recommend -q replan``) and after it (``recommend replan -q``) alike
GLOBAL_OPTIONS = ("quiet", "debug", "wide")


class OneLineUsageGroup(typer.core.TyperGroup):
    """The app's command group: click's usage errors, raised while a command line is parsed (the group's options,
    or a command's in :meth:`invoke`), become one line (:class:`_UsageLine`) instead of click's usage box.

    Every subcommand also takes the main command's :data:`GLOBAL_OPTIONS` it does not declare itself (a copy of
    the main option that sets the same switch), so ``recommend replan -q`` means ``recommend -q replan``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        globals_ = [p for p in self.params if p.name in GLOBAL_OPTIONS]
        for cmd in self.commands.values():
            taken = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
            for g in globals_:
                if taken.isdisjoint(g.opts):
                    extra = copy.copy(g)
                    extra.expose_value = False  # the command's function has no such parameter: the callback acts
                    extra.callback = _apply_global(str(g.name))
                    cmd.params.append(extra)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as e:
            raise _usage_line(e, info_name or "recommend") from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as e:
            raise _usage_line(e, ctx.command_path) from None


def _usage_line(e: Any, fallback_path: str) -> _UsageLine:
    path = e.ctx.command_path if getattr(e, "ctx", None) is not None else fallback_path
    return _UsageLine(e.format_message(), path)


app = typer.Typer(
    name="recommend",
    cls=OneLineUsageGroup,
    help="Plan LLM serving deployments: ranked Pareto plans with $/M tokens, estimates, vLLM deployment files.",
    no_args_is_help=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: wraps at any width and never truncates option names
    context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, exit_code: int = 2) -> "typer.Exit":
    """Print one line to stderr and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(exit_code)


#: ``--debug`` anywhere on the command line (or RECOMMENDER_DEBUG=1): unexpected errors show their traceback
DEBUG_ENV = "RECOMMENDER_DEBUG"
DEBUG_HINT = "re-run with --debug for the traceback"
MAX_MESSAGE_CHARS = 500


#: set per invocation by the app callback's --debug option
_debug_flag = [False]


def set_debug(on: bool) -> None:
    _debug_flag[0] = on


def debug_enabled() -> bool:
    return _debug_flag[0] or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str) -> str:
    """Collapse a message to one line of at most MAX_MESSAGE_CHARS characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= MAX_MESSAGE_CHARS else s[: MAX_MESSAGE_CHARS - 3] + "..."


def _os_message(e: OSError) -> str:
    """'cannot write /x/plan.json: Permission denied' style text for an OSError."""
    what = e.filename if e.filename is not None else ""
    reason = e.strerror or str(e)
    if isinstance(e, FileExistsError):
        return f"{what!s} already exists and is not a directory; give a new or existing directory"
    if isinstance(e, NotADirectoryError):
        return f"{what!s}: a part of the path is a file, not a directory; give a directory path"
    return f"{what}: {reason}" if what else reason


def user_error_message(e: BaseException) -> tuple[str, int] | None:
    """(one-line message, exit code) for an error caused by the user's input or environment; None if unexpected."""
    from pydantic import ValidationError

    if isinstance(e, RecommenderError):
        return one_line(str(e)), e.exit_code
    if isinstance(e, ValidationError):
        from recommender.yamlfile import validation_message

        return one_line(validation_message(e, "invalid input")), 2
    if isinstance(e, OSError):
        return one_line(_os_message(e)), 2
    if isinstance(e, RecursionError):
        return "input is nested too deeply", 2
    if isinstance(e, MemoryError):
        return "out of memory: the input is too large (give smaller files or fewer requests)", 2
    if isinstance(e, (OverflowError, ZeroDivisionError, FloatingPointError)):
        return one_line(f"a number is out of range ({e}); check the input values"), 2
    if isinstance(e, ImportError) and "storage" in str(e).lower():  # optuna: no driver for that URL scheme
        return one_line(f"storage error: {e} (check the --storage URL's scheme)"), 2
    module = type(e).__module__.split(".")[0]
    if module in ("sqlalchemy", "optuna", "psycopg", "sqlite3"):
        return one_line(f"storage error ({type(e).__name__}): {e}; check the --storage URL"), 2
    if isinstance(e, ValueError):
        return one_line(f"invalid value: {e}"), 2
    return None


def one_line_errors(func: F) -> F:
    """Every error becomes one line on stderr + non-zero exit; unexpected ones say how to see the traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        # typer exits and usage errors (typer >= 0.29 vendors click: its ClickException is a TyperException)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as e:
            known = user_error_message(e)
            if known is not None and not (debug_enabled() and not isinstance(e, RecommenderError)):
                raise fail(known[0], known[1]) from None
            if debug_enabled():
                raise
            raise fail(one_line(f"internal error ({type(e).__name__}: {e}); {DEBUG_HINT}"), 1) from None

    return wrapper  # type: ignore[return-value]
