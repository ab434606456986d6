"""An exclusive lock around a read-modify-write of a shared file (the /metrics scrape state).

Several ``recommend replan`` runs (one CronJob per deployment, or a ``--watch`` loop beside a manual run)
share one ``--state`` file, each adding its own URLs' baselines. Without a lock, two runs read the same old
file and the later rename drops the earlier run's URLs (issue 30: 8 concurrent runs kept 3 of 8). With it,
each run holds ``fcntl.flock(LOCK_EX)`` on a sidecar ``<file>.lock`` while it reads, merges and atomically
replaces the file, so every update lands.

The sidecar (never the data file itself: the data file is replaced by rename, and a lock on a replaced
inode guards nothing) is created once and left in place; it holds no data. It must be a regular file: a
symlink or FIFO there is refused in one line. ``flock`` is advisory: only our own runs honour it, which is
what is needed. The lock is released when the file descriptor closes, also when the process is killed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from recommender.errors import ConfigError

__all__ = ["DEFAULT_LOCK_TIMEOUT_S", "LOCK_SUFFIX", "LockTimeoutError", "locked", "lock_path"]

LOCK_SUFFIX = ".lock"
#: how long a run waits for another run's update (each holds the lock for one read + one write: milliseconds)
DEFAULT_LOCK_TIMEOUT_S = 60.0
_POLL_S = 0.01


class LockTimeoutError(ConfigError):
    """Another process held the lock longer than the timeout."""


def lock_path(path: Path) -> Path:
    """The sidecar lock file of ``path``: ``<path>.lock`` beside it."""
    return path.with_name(path.name + LOCK_SUFFIX)


@contextmanager
def locked(path: str | Path, *, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[Path]:
    """Hold the exclusive lock of ``path`` (its sidecar ``<path>.lock``) for the ``with`` block.

    Waits up to ``timeout_s`` for another holder, then raises :class:`LockTimeoutError` (one line)."""
    target = Path(path)
    lock = lock_path(target)
    lock.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock, flags, 0o644)
    except OSError as e:
        why = "it is a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise ConfigError(f"lock file {lock} cannot be opened ({why}); remove it or give another --state path") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"lock file {lock} is not a regular file; remove it or give another --state path")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(f"{target} is locked by another run for over {timeout_s:g} s ({lock}); "
                                           f"retry when it has finished") from None
                time.sleep(_POLL_S)
        yield target
    finally:
        os.close(fd)  # releases the lock
