"""Flag-by-flag check of a ``vllm serve`` argument list against vLLM 0.33's real parser dump.

The table is ``recommender/data/vllm/serve-flags.json`` (every ``vllm serve`` action of the 0.33.0
wheel: names, value type, nargs, choices, runtime-valid values, nested JSON config fields) plus
``removed-flags.txt``. ``check_serve_args`` walks an argv the way vLLM's ``FlexibleArgumentParser``
does and raises :class:`VllmFlagError` (a ``DeployError``) at the first argument vLLM 0.33 would
reject, or that this project refuses to emit:

* unknown or removed flags; a flag given twice (argparse keeps the last one silently);
* a value of the wrong type: ``int``, ``float``, JSON object; a boolean flag followed by a value;
* a value outside the argparse ``choices`` or outside the values vLLM validates at engine start
  (``--quantization``, ``--kv-cache-dtype``, ``--load-format``, the ``kv_connector`` registry);
* unknown keys inside ``--kv-transfer-config`` / ``--compilation-config`` / ``--kv-events-config``
  / ``--speculative-config`` (vLLM's config dataclasses are pydantic with ``extra="forbid"``);
* human-readable integers (``8k``): vLLM accepts them but reads ``8k`` as 8000, not 8192, so this
  project only emits plain decimal integers and the checker enforces that.

On success it returns ``{dest: value}`` (e.g. ``{"model_tag": "...", "tensor_parallel_size": 4}``)
so tests can compare what different renderers would make vLLM run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping, Sequence

from recommender.errors import DeployError

#: JSON-valued flags whose object keys are checked against the dumped config dataclass fields.
NESTED_CONFIG_FOR_DEST = {
    "kv_transfer_config": "KVTransferConfig",
    "compilation_config": "CompilationConfig",
    "kv_events_config": "KVEventsConfig",
    "speculative_config": "SpeculativeConfig",
}
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")
KV_BUFFER_DEVICES = ("cuda", "cpu", "xpu")
#: ``-O0`` ... ``-O3`` are rewritten by vLLM to ``--optimization-level N``.
OPTIMIZATION_LEVELS = ("0", "1", "2", "3")

_PLAIN_INT = re.compile(r"-?[0-9]+")


class VllmFlagError(DeployError):
    """An argument that vLLM 0.33's ``vllm serve`` would reject (or that we refuse to emit)."""


@dataclass(frozen=True)
class FlagSpec:
    """One ``vllm serve`` action: ``names`` include negative forms (``--no-x``, ``--disable-x``)."""

    dest: str
    names: tuple[str, ...]
    value_type: str
    nargs: int | str | None
    choices: tuple[str, ...] | None
    runtime_valid_values: tuple[str, ...] | None
    deprecated: bool
    negative_names: frozenset[str] = frozenset()

    @property
    def takes_value(self) -> bool:
        """Boolean actions (paired ``--x/--no-x`` and ``store_true``) take no value."""
        return self.nargs != 0


@dataclass(frozen=True)
class FlagTable:
    """The parsed data files: flag name -> spec, removed flags, nested config fields."""

    vllm_version: str
    by_name: Mapping[str, FlagSpec]
    removed: frozenset[str]
    nested_fields: Mapping[str, frozenset[str]]
    kv_connectors: tuple[str, ...]


def _read_data(name: str) -> str:
    return resources.files("recommender").joinpath("data", "vllm", name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def flag_table() -> FlagTable:
    """Load (once) the vLLM 0.33 flag table shipped as package data."""
    doc = json.loads(_read_data("serve-flags.json"))
    by_name: dict[str, FlagSpec] = {}
    kv_connectors: tuple[str, ...] = ()
    for raw in doc["flags"]:
        names = [n for n in raw["flags"] if n.startswith("-")]
        if not names:  # the positional model_tag
            continue
        names += list(raw.get("negative_flags") or []) + list(raw.get("hidden_accepted_flags") or [])
        choices = raw.get("choices")
        spec = FlagSpec(
            dest=raw["dest"],
            names=tuple(dict.fromkeys(names)),
            value_type=str(raw.get("value_type")),
            nargs=raw.get("nargs"),
            choices=tuple(str(c) for c in choices if c is not None) if choices else None,
            runtime_valid_values=tuple(raw["runtime_valid_values"]) if raw.get("runtime_valid_values") else None,
            deprecated=bool(raw.get("deprecated")),
            negative_names=frozenset(raw.get("negative_flags") or []),
        )
        if spec.dest == "kv_transfer_config" and spec.runtime_valid_values:
            kv_connectors = spec.runtime_valid_values  # valid kv_connector names, not whole values
            spec = dataclasses.replace(spec, runtime_valid_values=None)
        for n in spec.names:
            by_name[n] = spec
    removed = set(doc.get("rejected_legacy_flags_verified", {}))
    for line in _read_data("removed-flags.txt").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            removed.add(line)
    nested = {k: frozenset(v) for k, v in doc.get("nested_json_configs", {}).items()}
    return FlagTable(doc["vllm_version"], by_name, frozenset(removed), nested, kv_connectors)


def _normalise_flag(token: str) -> str:
    """``--gpu_memory_utilization`` -> ``--gpu-memory-utilization`` (vLLM converts underscores)."""
    if token.startswith("--"):
        return "--" + token[2:].replace("_", "-")
    return token


def _fail(flag: str, value: object, why: str) -> VllmFlagError:
    shown = f" {value!r}" if value is not None else ""
    return VllmFlagError(f"vllm serve {flag}{shown}: {why} (vLLM {flag_table().vllm_version})")


def _check_int(flag: str, value: str) -> int:
    if not _PLAIN_INT.fullmatch(value):
        raise _fail(flag, value, "expected a plain integer")
    return int(value)


def _check_human_int(flag: str, value: str, allow_auto: bool) -> int | str:
    if allow_auto and value in ("auto", "-1"):
        return value
    if not _PLAIN_INT.fullmatch(value):
        raise _fail(flag, value, "expected a plain integer (vLLM reads '8k' as 8000, so only digits are emitted)")
    return int(value)


def _check_float(flag: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise _fail(flag, value, "expected a number") from None
    if not math.isfinite(x):
        raise _fail(flag, value, "expected a finite number")
    return x


def _check_nested(flag: str, dest: str, obj: dict[str, Any]) -> None:
    table = flag_table()
    config = NESTED_CONFIG_FOR_DEST.get(dest)
    if config is None or config not in table.nested_fields:
        return
    unknown = sorted(set(obj) - table.nested_fields[config])
    if unknown:
        raise _fail(flag, json.dumps(obj), f"unknown {config} key(s) {unknown} (vLLM forbids extra keys)")
    if dest == "kv_transfer_config":
        connector = obj.get("kv_connector")
        if connector is not None and table.kv_connectors and connector not in table.kv_connectors:
            raise _fail(flag, connector, "kv_connector is not registered in this vLLM version")
        role = obj.get("kv_role")
        if connector is not None and role not in KV_ROLES:
            raise _fail(flag, role, f"kv_role must be one of {list(KV_ROLES)} when kv_connector is set")
        policy = obj.get("kv_load_failure_policy", "fail")
        if policy not in KV_LOAD_FAILURE_POLICIES:
            raise _fail(flag, policy, f"kv_load_failure_policy must be one of {list(KV_LOAD_FAILURE_POLICIES)}")
        device = obj.get("kv_buffer_device", "cuda")
        if device not in KV_BUFFER_DEVICES:
            raise _fail(flag, device, f"kv_buffer_device must be one of {list(KV_BUFFER_DEVICES)}")
        extra = obj.get("kv_connector_extra_config", {})
        if not isinstance(extra, dict):
            raise _fail(flag, extra, "kv_connector_extra_config must be a JSON object")


def _check_json(flag: str, spec: FlagSpec, value: str) -> Any:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise _fail(flag, value, f"not valid JSON ({e.msg})") from None
    if "dataclass" in spec.value_type and not isinstance(obj, dict):
        raise _fail(flag, value, "expected a JSON object")
    if isinstance(obj, dict):
        _check_nested(flag, spec.dest, obj)
    return obj


def _check_value(flag: str, spec: FlagSpec, value: str) -> Any:
    """Type-check one value token of ``flag``; return the parsed value."""
    vt = spec.value_type
    if "human_readable_int" in vt:
        parsed: Any = _check_human_int(flag, value, allow_auto=vt.endswith("_or_auto"))
    elif "json" in vt:
        parsed = _check_json(flag, spec, value)
    elif re.search(r"\bint\b", vt):
        parsed = _check_int(flag, value)
    elif "float" in vt:
        parsed = _check_float(flag, value)
    else:
        parsed = value
    if spec.choices is not None:
        probe = value.lower().replace("-", "_") if vt.startswith("str (normalized") else value
        if probe not in spec.choices:
            raise _fail(flag, value, f"must be one of {list(spec.choices)}")
    if spec.runtime_valid_values is not None and value not in spec.runtime_valid_values:
        raise _fail(flag, value, f"vLLM rejects it at engine start; valid: {', '.join(spec.runtime_valid_values)}")
    return parsed


def check_serve_args(argv: Sequence[str]) -> dict[str, Any]:
    """Validate the arguments after ``vllm serve`` and return ``{dest: parsed value}``.

    ``argv[0]`` is the model (positional ``model_tag``); every further token is a flag or a flag's
    value. Raises :class:`VllmFlagError` naming the flag, the value and the reason.
    """
    table = flag_table()
    args = [str(a) for a in argv]
    if not args:
        raise VllmFlagError("vllm serve: no model given")
    model = args[0]
    if not model or model.startswith("-"):
        raise VllmFlagError(f"vllm serve: the first argument must be the model, got {model!r}")
    parsed: dict[str, Any] = {"model_tag": model}
    i = 1
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            raise _fail(token, None, "unexpected positional argument (vLLM takes only the model positionally)")
        name, eq, inline = token.partition("=")
        m = re.fullmatch(r"-O([0-3]?)", name)
        if m:  # -O3, -O=3, -O 3
            level = m.group(1) or inline
            if not m.group(1) and not eq:
                i += 1
                level = args[i] if i < len(args) else ""
            if level not in OPTIMIZATION_LEVELS:
                raise _fail("-O", level, f"optimization level must be one of {list(OPTIMIZATION_LEVELS)}")
            name, values = "--optimization-level", [level]
            spec = table.by_name[name]
        else:
            name = _normalise_flag(name)
            base, dot, _key = name.partition(".")
            if name in table.removed or base in table.removed:
                raise _fail(name, None, "this flag was removed from vLLM")
            spec = table.by_name.get(base if dot else name)  # type: ignore[assignment]
            if spec is None:
                raise _fail(name, None, "unknown flag")
            if dot and "json" not in spec.value_type:
                raise _fail(name, None, "dotted keys are only accepted by JSON-valued flags")
            if spec.deprecated:
                raise _fail(name, None, "deprecated flag; not emitted")
            if not spec.takes_value:
                if eq:
                    raise _fail(name, inline, "boolean flag takes no value")
                values = []
            elif eq:
                values = [inline]
            elif spec.nargs == "?":  # optional value (e.g. --hf-token): taken only if one follows
                values = [args[i + 1]] if i + 1 < len(args) and not args[i + 1].startswith("-") else []
                i += len(values)
            elif spec.nargs == "+":
                values = []
                while i + 1 < len(args) and not args[i + 1].startswith("-"):
                    i += 1
                    values.append(args[i])
                if not values:
                    raise _fail(name, None, "expects at least one value")
            else:
                if i + 1 >= len(args) or (args[i + 1].startswith("-") and not _PLAIN_INT.fullmatch(args[i + 1])):
                    raise _fail(name, None, "expects a value")
                i += 1
                values = [args[i]]
            if dot:  # --kv-transfer-config.kv_role kv_producer: a single key, checked as a string
                parsed.setdefault(spec.dest, {})
                i += 1
                continue
        if spec.dest in parsed:
            raise _fail(name, None, "given twice (vLLM would silently keep the last value)")
        if not spec.takes_value:
            parsed[spec.dest] = name not in spec.negative_names
        elif spec.nargs == "?" and not values:
            parsed[spec.dest] = None
        elif spec.nargs == "+":
            parsed[spec.dest] = [_check_value(name, spec, v) for v in values]
        else:
            parsed[spec.dest] = _check_value(name, spec, values[0])
        i += 1
    return parsed
