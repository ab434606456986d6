"""The RecommenderError family: every user mistake is one of these.

The CLI prints ``str(error)`` on one line and exits non-zero; the message says what went wrong,
why, and what to try.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped (``\\n``, ``\\x1b``), so that
    a message quoting user input (a YAML key, a file name) still prints on one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class RecommenderError(Exception):
    """Base class; ``exit_code`` is what the CLI returns. ``str()`` is always one line (:func:`one_line`)."""

    exit_code = 2

    def __str__(self) -> str:
        return one_line(super().__str__())


class UnitError(RecommenderError, ValueError):
    """A human quantity ('30ms', '80GB', '$2.49/h') could not be read."""


class CatalogError(RecommenderError, KeyError):
    """Unknown or duplicate catalog id, or a malformed catalog file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return one_line(str(self.args[0])) if self.args else ""


class ConfigError(RecommenderError, ValueError):
    """A workload / policy / model config file or flag is invalid (names the field)."""


class UnsupportedArchitectureError(ConfigError):
    """A Hugging Face config.json whose architecture we cannot model (names the field)."""


class DoesNotFitError(RecommenderError):
    """The model (weights + minimum KV) does not fit the GPUs; carries the shortfall in bytes."""

    exit_code = 3

    def __init__(self, message: str, shortfall_bytes: float = 0.0) -> None:
        super().__init__(message)
        self.shortfall_bytes = shortfall_bytes


class InfeasibleError(RecommenderError):
    """No deployment meets the SLOs; the message names the binding constraint and closest plan."""

    exit_code = 4


class DeployError(RecommenderError):
    """A plan cannot be turned into deployable files (unsupported GPU, dtype, ...)."""


class TrafficSourceError(RecommenderError):
    """A metrics endpoint or request log could not be read or has too little data."""


class CalibrationError(RecommenderError):
    """Benchmark results for calibration are malformed or incomplete (names file and field)."""
