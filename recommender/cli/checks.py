"""Checks the main job runs before it starts working: every option, its dependency and every output path.

A mistake here costs the user nothing: it is reported (one line) before a minute of search, not after.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from collections.abc import Collection
from pathlib import Path

from recommender.bounded import MAX_SEED, MAX_VERIFY, check_storage
from recommender.errors import ConfigError
from recommender.workload import Workload

PLOT_SUFFIXES = (".html", ".htm", ".svg", ".png")


def check_writable_file(path: str, flag: str) -> None:
    """``path`` can be created or overwritten: its folder exists and is writable, and it is absent or a regular
    file (never a device node, FIFO or symlink the atomic writer would replace)."""
    from recommender.bounded import check_replaceable

    if not path.strip() or not path.isprintable():
        raise ConfigError(f"{flag} {path!r}: give a file name (one printable line, not blank)")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable; choose another path")
    check_replaceable(p, flag)
    why = _cannot_create_in(parent)
    if why:
        raise ConfigError(f"{flag} {path}: cannot write in {parent} ({why}); choose another path")


def check_writable_dir(path: str, flag: str) -> None:
    """``path`` is a writable folder, or a folder that can be created (its nearest existing parent is writable)."""
    if not path.strip() or not path.isprintable():
        raise ConfigError(f"{flag} {path!r}: give a folder name (one printable line, not blank)")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {path}: exists and is not a directory")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"{flag} {path}: {probe} is not writable; choose another folder")
    why = _cannot_create_in(probe)
    if why:
        raise ConfigError(f"{flag} {path}: cannot write in {probe} ({why}); choose another folder")


def _cannot_create_in(folder: Path) -> str:
    """Why a file cannot be created in ``folder`` (empty when it can): a real probe, since ``os.access``
    says yes to root on read-only and virtual file systems (/proc, a read-only mount)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".recommend-probe-", delete=True):
            pass
    except OSError as e:
        return e.strerror or type(e).__name__
    return ""


def check_plot(path: str) -> None:
    """Suffix known; .svg/.png need kaleido (static export of the one plotly chart)."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot {path}: use a .html, .svg or .png file name")
    if suffix in (".svg", ".png") and importlib.util.find_spec("kaleido") is None:
        raise ConfigError(f"--plot {path}: {suffix} export needs kaleido (pip install kaleido) and a Chrome/Chromium; "
                          ".html needs nothing (or use --report FILE.html for the full page)")
    check_writable_file(path, "--plot")


def check_main_options(*, fmt: str, formats: Collection[str], top: int, workers: int, storage: str | None,
                       trials: int | None, seed: int, timeout: float | None, plot: str | None, report: str | None,
                       emit: str | None, verify: int | None = None) -> None:
    """Every main-job option that can be wrong on its own, checked before the search."""
    check_storage(storage)
    if verify is not None and not 0 <= verify <= MAX_VERIFY:
        raise ConfigError(f"--verify {verify}: give how many plans to verify, from 0 (off) to {MAX_VERIFY}")
    if fmt not in formats:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(formats)}")
    if top < 1:
        raise ConfigError(f"--top {top}: must be >= 1")
    if trials is not None and trials < 1:
        raise ConfigError(f"--trials {trials}: give a positive number of trials (or leave it out for the policy's default)")
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed {seed}: give an integer from 0 to {MAX_SEED}")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout {timeout}: give a positive number of seconds")
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be >= 1")
    if workers > 1 and not storage:
        raise ConfigError(f"--workers {workers} needs --storage (e.g. --storage study.db, or a postgresql:// URL) "
                          "so the processes share trials")
    if plot is not None:
        check_plot(plot)
    if report is not None:
        if Path(report).suffix.lower() not in (".html", ".htm"):
            raise ConfigError(f"--report {report}: the report is one HTML page; use a .html file name")
        check_writable_file(report, "--report")
    if emit is not None:
        check_writable_dir(emit, "--emit")


def resolve_workload_names(w: Workload) -> Workload:
    """Model, GPU and price names through the catalog's resolver (unknown names fail here, before the search).

    GPU ids and price keys become catalog ids (``h100`` -> ``h100-sxm``); the model string is kept (the plan
    records the catalog id and the Hugging Face repo it resolves to).
    """
    from recommender.catalog import default_catalog

    cat = default_catalog()
    cat.model(w.model)
    gpus = tuple(dict.fromkeys(cat.gpu_id(g) for g in w.gpus)) if w.gpus else None
    prices = {cat.gpu_id(k): v for k, v in w.usd_per_gpu_hour_overrides.items()}
    owned = tuple(dataclasses.replace(o, gpu=cat.gpu_id(o.gpu)) for o in w.inventory)
    if len({o.gpu for o in owned}) < len(owned):
        raise ConfigError("--inventory names a GPU type twice; give each type once with its total count")
    return dataclasses.replace(w, gpus=gpus, usd_per_gpu_hour_overrides=prices, inventory=owned)
