"""User files at the edge: one clear ConfigError for a missing or malformed YAML file, and one format for
pydantic validation errors ("<file>: field 'a.b': <message>")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from recommender.bounded import read_file_text
from recommender.errors import ConfigError


def read_yaml_file(path: str | Path, what: str, hint: str = "") -> Any:
    """Parse ``path``; errors say "<what> file <path> does not exist / is not valid YAML: <first line>"."""
    p = Path(path)
    suffix = f" ({hint})" if hint else ""
    try:
        text = read_file_text(p, f"{what} file")
    except ConfigError as e:
        raise type(e)(f"{e}{suffix}") from None
    try:
        return yaml.safe_load(text)
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
