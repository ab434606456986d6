"""Metavars that name the value (``--gpu GPU``, ``--workload FILE``, ``--top N``), set once for every command.

Typer would print the Python type (``<str>``, ``<int>``) and ``{plan}`` for a positional argument; this module
walks the registered commands after they are imported and gives each option without an explicit metavar
one from its name (:data:`BY_NAME`), else from its type (``N`` for integers, ``X`` for floats, ``TEXT``).
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import typer
from typer.models import ParameterInfo

#: parameter name -> metavar (the Python parameter name of the command function)
BY_NAME = {
    "workload": "FILE", "profile": "FILE", "policy": "FILE", "values": "FILE", "trace": "FILE", "timeseries": "FILE",
    "report": "FILE", "plot": "FILE", "current": "PLAN.json", "plan": "PLAN.json", "results": "FILE...",
    "state": "FILE", "bearer_token_file": "FILE", "basic_auth_password_file": "FILE", "emit": "DIR",
    "model": "MODEL", "gpu": "GPU", "gpus": "GPU,...", "inventory": "GPU=N[@$/h],...", "rate": "REQ/S",
    "request_rate": "REQ/S", "slo": "METRIC=TIME[@PCT]", "timeout": "DURATION", "interval": "DURATION",
    "prompt_tokens": "TOKENS", "output_tokens": "TOKENS", "context": "TOKENS", "random_input_len": "TOKENS",
    "random_output_len": "TOKENS", "max_num_batched_tokens": "TOKENS", "storage": "URL", "provider": "PROVIDER",
    "engine": "ENGINE", "price": "USD/H", "fmt": "FORMAT", "fmt_name": "FORMAT", "weight_dtype": "DTYPE",
    "kv_dtype": "DTYPE", "deployment": "NAME", "study_name": "NAME", "namespace": "NAME", "image": "IMAGE",
    "router_image": "IMAGE", "replan_image": "IMAGE", "storage_class": "NAME", "node_selector": "KEY=VALUE",
    "toleration": "KEY[=VALUE]:EFFECT", "schedule": "CRON", "traffic": "SOURCE", "more_traffic": "SOURCE...",
    "selector": "MATCHERS", "history_secret": "SECRET", "apply_to": "DEPLOYMENT", "checkpoint": "REPO",
    "parameters": "NAME,...", "held_out_by": "KEY", "concurrency": "N|max", "bearer_token_env": "VAR",
    "basic_auth_password_env": "VAR", "basic_auth_user": "USER", "gpu_memory_utilization": "FRACTION",
    "shared_prefix_fraction": "FRACTION", "burstiness": "SHAPE",
}


def _by_type(annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    base = args[0]
    while typing.get_args(base):  # List[int], Annotated[...]
        base = typing.get_args(base)[0]
    return {int: "N", float: "X"}.get(base, "TEXT")


def name_metavars(app: typer.Typer) -> None:
    """Give every option and argument of ``app``'s commands (and its callback) a metavar naming the value."""
    callbacks = [c.callback for c in app.registered_commands]
    if app.registered_callback is not None:
        callbacks.append(app.registered_callback.callback)
    for cb in callbacks:
        if cb is None:
            continue
        hints = typing.get_type_hints(cb, include_extras=True)
        for name, param in inspect.signature(cb).parameters.items():
            hint = hints.get(name)
            base = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
            for info in (param.default, *getattr(hint, "__metadata__", ())):
                if isinstance(info, ParameterInfo) and info.metavar is None and base is not bool:
                    info.metavar = BY_NAME.get(name) or _by_type(base)


def plain_argument_names() -> None:
    """Positional arguments as click writes them (``PLAN.json``, optional ``[SOURCE...]``), not typer 0.29's
    ``{plan}``; an argument with a metavar is not followed by its Python type (``<path>``)."""
    from typer.core import TyperArgument

    def usage_name(self: Any) -> str:
        name = str(self.metavar or self.name or "").upper() if self.metavar is None else str(self.metavar)
        return name if self.required else f"[{name}]"

    original = TyperArgument.display_type_rich

    def display_type(self: Any, ctx: Any) -> str | None:
        return None if self.metavar is not None else original(self, ctx)

    if hasattr(TyperArgument, "_usage_display_name"):
        TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]
        TyperArgument.display_type_rich = display_type  # type: ignore[method-assign]
