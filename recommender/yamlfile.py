"""User files at the edge: one clear ConfigError for a missing or malformed YAML file, and one format for
pydantic validation errors ("<file>: field 'a.b': <message>"). A key given twice in one mapping is refused
(PyYAML would keep the last one silently)."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from recommender.bounded import read_file_text
from recommender.errors import ConfigError


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping key given twice (PyYAML keeps the last one silently)."""


def _unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            dup = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping words that
            continue
        if dup:
            raise yaml.constructor.ConstructorError(
                f"duplicate key {str(key)[:60]!r} at line {key_node.start_mark.line + 1}", None,
                "a key may appear once per mapping", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (``yaml.YAMLError``)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml_file(path: str | Path, what: str, hint: str = "") -> Any:
    """Parse ``path``; errors say "<what> file <path> does not exist / is not valid YAML: <first line>"."""
    p = Path(path)
    suffix = f" ({hint})" if hint else ""
    try:
        text = read_file_text(p, f"{what} file")
    except ConfigError as e:
        raise type(e)(f"{e}{suffix}") from None
    try:
        return load_yaml_text(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        context = getattr(e, "context", None)  # a duplicate key: "duplicate key 'model' at line 2"
        if context and str(context).startswith("duplicate key"):
            problem = f"{context}: {problem}"
        raise ConfigError(f"{what} file {p} is not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{what} file {p} is nested too deeply") from None


def validation_message(e: ValidationError, where: str, *, model: type[BaseModel] | None = None,
                       text: str | None = None) -> str:
    """The first pydantic error as "<where>: field 'a.b': <message> (+N more)".

    An unknown key comes first (a misspelt key also makes its right spelling "missing"); with ``model`` (the
    schema) it names the closest valid key ("did you mean 'arrival_rate'?"), and with ``text`` (the YAML
    source) the line and column of the key."""
    errors = e.errors()
    unknown = [x for x in errors if x["type"] == "extra_forbidden"]
    err = unknown[0] if unknown else errors[0]
    path = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
    loc = ".".join(str(p) for p in path) or "(top level)"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    msg = err["msg"]
    if unknown and model is not None:
        valid = keys_at(model, path[:-1])
        nested = [f"{k}.{sub}" for k in valid for sub in keys_at(model, (*path[:-1], k))]
        close = difflib.get_close_matches(str(path[-1]), valid, n=1, cutoff=0.6) or [
            n for n in nested if n.split(".")[-1] in difflib.get_close_matches(
                str(path[-1]), [x.split(".")[-1] for x in nested], n=1, cutoff=0.6)][:1]
        msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else
                               f"; valid keys here: {', '.join(valid)}" if valid else "")
    at = yaml_position(text, path) if text is not None else None
    return f"{where}{f' line {at[0]}, column {at[1]}' if at else ''}: field '{loc}': {msg}{more}"


def keys_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys the schema accepts at ``path`` (list indexes and mapping keys of non-model values skipped)."""
    cls: type[BaseModel] | None = model
    for part in path:
        if cls is None:
            return []
        if isinstance(part, int):
            continue
        f = cls.model_fields.get(str(part))
        cls = _model_in(f.annotation) if f is not None else None
    return [] if cls is None else [f.alias or n for n, f in cls.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``X | None``, ``list[X]``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def yaml_position(text: str, path: tuple[Any, ...]) -> tuple[int, int] | None:
    """(line, column), 1-based, of the key at ``path`` in YAML ``text`` (of the deepest part found), or None."""
    try:
        node = yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None
    mark = None if node is None else node.start_mark
    for part in path:
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(getattr(k, "value", "")) == str(part):
                    mark, nxt = k.start_mark, v
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            nxt = node.value[part]
            mark = nxt.start_mark
        if nxt is None:
            break
        node = nxt
    return None if mark is None else (mark.line + 1, mark.column + 1)
