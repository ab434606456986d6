"""The one crash-safe single-file writer: temp file in the target folder, fsync, ``os.replace``, fsync the folder.

The target must be absent or a regular file (``recommender.bounded.check_replaceable``): a device node, FIFO,
socket, directory or symlink there is refused in one line, never replaced (as root, ``--out /dev/null`` would
otherwise swap /dev/null for a regular file). A reader (or a crash) sees either the old file or the complete new one, never half of it. Every file the
package writes goes through here (deploy files, plan.json, calibrated profiles, replan state, the
``--plot`` / ``--report`` pages and images, ``simulate --timeseries``); several files
that belong together go through ``recommender.deploy.writer.write_file_set``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from recommender.bounded import check_replaceable


def atomic_write_text(path: Path, text: str, mode: int = 0o644, *, what: str = "output file") -> Path:
    """Write ``text`` (UTF-8, ``\n`` line ends) to ``path`` atomically and give it permission bits ``mode``."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode, what=what)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644, *, what: str = "output file") -> Path:
    """Write ``data`` to ``path`` atomically and give it permission bits ``mode``; ``what`` names the file in
    the refusal of a special file."""
    path = check_replaceable(Path(path), what)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable (POSIX); not possible on every platform
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return path
