"""User files at the edge: one clear ConfigError for a missing or malformed YAML file, and one format for
pydantic validation errors ("<file>: field 'a.b': <message>"). A key given twice in one mapping is refused
(PyYAML would keep the last one silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

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
        raise ConfigError(f"{what} file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{what} file {p} is nested too deeply") from None


def validation_message(e: ValidationError, where: str) -> str:
    """The first pydantic error as "<where>: field 'a.b': <message> (+N more)"."""
    errors = e.errors()
    err = errors[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-")) or "(top level)"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: field '{loc}': {err['msg']}{more}"
