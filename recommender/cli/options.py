"""Options shared by several commands, declared once (``Annotated`` aliases), and the Enum choices.

A command declares ``model: options.Model = None``; typer reads the flag names and help from the alias, so
``estimate`` and ``simulate`` spell their common options (model, GPU, parallelism, dtypes, lengths, engine,
engine limits) the same way and document them once. ``--format`` values are Enums, read with :func:`choice`
(one-line error naming the choices, like every other user mistake; click's own choice check prints a
multi-line usage box).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional, TypeVar

import typer

from recommender.errors import ConfigError

E = TypeVar("E", bound=Enum)


def choice(enum: type[E], value: str, flag: str) -> E:
    """``value`` as a member of ``enum``; otherwise one line: "--format 'xml': use text or json"."""
    try:
        return enum(value)
    except ValueError:
        names = [str(m.value) for m in enum]
        listed = " or ".join(names) if len(names) == 2 else f"one of {', '.join(names[:-1])} or {names[-1]}"
        raise ConfigError(f"{flag} {value!r}: use {listed}") from None


def format_option(enum: type[Enum], short: bool = True) -> Any:
    """The ``--format/-f`` option declaration listing ``enum``'s values."""
    names = ("--format", "-f") if short else ("--format",)
    return typer.Option(*names, metavar="FORMAT", help="|".join(str(m.value) for m in enum))


class PlanFormat(str, Enum):
    """``recommend --format``."""

    table = "table"
    json = "json"
    yaml = "yaml"
    csv = "csv"


class TextOrJson(str, Enum):
    """``--format`` of estimate and simulate."""

    text = "text"
    json = "json"


class TableOrJson(str, Enum):
    """``--format`` of replan and history."""

    table = "table"
    json = "json"


# -- one configuration (estimate, simulate) -----------------------------------------------------------------
Model = Annotated[Optional[str], typer.Option("--model", "-m", help="Catalog model id, or a path to a Hugging Face config.json.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", "-g", help="Catalog GPU id (e.g. h100-sxm).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs per replica.")]
Replicas = Annotated[int, typer.Option("--replicas", help="Identical replicas (data parallel; requests are routed round-robin).")]
WeightDtype = Annotated[Optional[str], typer.Option(
    "--weight-dtype", help="bf16|fp16|fp8|int8|int4|fp4|mxfp4 (default: the checkpoint's).")]
KvDtype = Annotated[str, typer.Option("--kv-dtype", help="KV-cache dtype: bf16|fp8.")]


def _checkpoint_help(with_plan: str, layout: str) -> str:
    return ("The checkpoint vLLM loads: a Hugging Face repo id (or local path) of pre-quantized weights, or "
            "'none' (or '') for the model's own repo, quantized at load where --weight-dtype is not its "
            "own (online fp8). Default: the model catalog's pre-quantized checkpoint for --weight-dtype, "
            f"else the model's own; {with_plan}. A block-quantized one "
            f"(Qwen/Qwen3-235B-A22B-FP8) refuses a {layout} that splits its 128x128 blocks.")


Checkpoint = Annotated[Optional[str], typer.Option("--checkpoint", help=_checkpoint_help(
    "with --plan, the pool's", "--tp / --data-parallel-size"))]
#: ``simulate``'s: with ``--plan``, every pool's checkpoint (as ``deploy --checkpoint``); no --data-parallel-size flag
FlagCheckpoint = Annotated[Optional[str], typer.Option("--checkpoint", help=_checkpoint_help(
    "with --plan, every pool's instead of the plan's", "--tp (or a --plan pool's layout)"))]


def tokens(flag: str) -> Any:
    """A typer ``parser`` for token counts: ``8000``, ``8k``, ``1.5M`` (``recommender.units.parse_count``)."""

    def parse(text: str | int) -> int:
        from recommender.errors import UnitError
        from recommender.units import parse_count

        try:
            return parse_count(text, flag)  # a negative count is refused where the command checks its range
        except UnitError as e:  # one line, like every other mistake (click would print a usage box)
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None

    return parse


PromptTokens = Annotated[Optional[int], typer.Option("--prompt-tokens", parser=tokens("--prompt-tokens"),
                                                     help="Prompt tokens per request (2000 or 2k).")]
OutputTokens = Annotated[Optional[int], typer.Option("--output-tokens", parser=tokens("--output-tokens"),
                                                     help="Output tokens per request (200, 1k).")]
Engine = Annotated[str, typer.Option("--engine", help="Efficiency profile: vllm|sglang|trtllm|atom|lmdeploy|gpt-fast (catalogs/profiles).")]
Profile = Annotated[Optional[str], typer.Option("--profile", help="A calibrated profile YAML (overrides --engine).")]
GpuMemoryUtilization = Annotated[float, typer.Option(
    "--gpu-memory-utilization", help="Fraction of GPU memory vLLM may use (vLLM 0.33's default: 0.92).")]
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="CUDA graphs (off = eager launches).")]
MaxNumSeqs = Annotated[Optional[int], typer.Option("--max-num-seqs", help="Engine batch limit (default: vLLM's for this GPU).")]
MaxNumBatchedTokens = Annotated[Optional[int], typer.Option("--max-num-batched-tokens", parser=tokens("--max-num-batched-tokens"),
                                                            help="Engine token budget per step (8192 or 8k).")]
ChunkedPrefill = Annotated[bool, typer.Option("--chunked-prefill/--no-chunked-prefill", help="vLLM chunked prefill.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (same seed, same result).")]

# -- output width -------------------------------------------------------------------------------------------
Wide = Annotated[bool, typer.Option("--wide", help="Lines as long as they come (default: fitted to $COLUMNS or the terminal).")]

#: set by the main callback's --wide (``recommend --wide SUBCOMMAND``)
_wide_flag = [False]


def note_skipped(fmt: str, reason: str) -> None:
    """A deployment output a group ('all', 'platforms') left out because it refused the plan: one note on stderr
    (``recommender.deploy.render_deploy``'s ``on_skip``)."""
    typer.echo(f"note: {fmt} not written: {reason.removeprefix(f'{fmt}: ')}", err=True)


def set_wide(on: bool) -> None:
    _wide_flag[0] = on


def echo_fitted(text: str, wide: bool = False, *, err: bool = False) -> None:
    """Echo ``text`` with every line fitted to the terminal (``recommender.render.table.fit_text``), unless
    --wide (here or on the main command) or the output is a file or pipe without $COLUMNS."""
    from recommender.render.table import fit_text

    typer.echo(fit_text(text, None if wide else fitted_width()), err=err)


def fitted_width() -> int | None:
    """The width to fit text to: None with the main command's --wide, else ``terminal_width()``."""
    from recommender.render.table import terminal_width

    return None if _wide_flag[0] else terminal_width()
