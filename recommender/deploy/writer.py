"""Crash-safe file output.

* ``atomic_write_text`` (from ``recommender.atomic``, the one single-file writer): temp file, fsync,
  ``os.replace``; a reader (or a crash) sees either the old file or the complete new one, never half of it.
* ``write_file_set``: several files that belong together (a plan and its deployment files): written into a temp
  folder and swapped in as a whole, so a reader never sees files of two plans side by side.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from recommender.atomic import atomic_write_text
from recommender.bounded import read_file_text
from recommender.errors import ConfigError

__all__ = ["KNOWN_OUTPUT_NAMES", "SET_MANIFEST", "atomic_write_text", "write_file_set"]


# --------------------------------------------------------------------------- file sets

#: hidden file in every written set: which files belong to it (written last, so its presence means complete)
SET_MANIFEST = ".recommender-files.json"
#: names an older recommender wrote without a manifest; a folder holding only these may be replaced
KNOWN_OUTPUT_NAMES = frozenset({"plan.json", "k8s.yaml", "helm-values.yaml", "vllm-serve.sh",
                                "vllm-serve-prefill.sh", "vllm-serve-decode.sh", "replan-cronjob.yaml"})
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(parent: Path, name: str) -> None:
    """Delete ``.<name>.set-<pid>-*`` folders of processes that no longer run (a killed earlier write)."""
    prefix = f".{name}.set-"
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for p in entries:
        if not p.name.startswith(prefix) or not p.is_dir() or p.is_symlink():
            continue
        pid = p.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
            shutil.rmtree(p, ignore_errors=True)


def _replaceable(out: Path, new_names: set[str]) -> None:
    """Refuse to replace a folder that holds files recommender did not write (one-line ConfigError)."""
    entries = {p.name for p in out.iterdir()}
    allowed = KNOWN_OUTPUT_NAMES | new_names | {SET_MANIFEST}
    if SET_MANIFEST in entries:
        try:
            text = read_file_text(out / SET_MANIFEST, "output manifest", limit=1 << 20)  # a FIFO never hangs us
            listed = json.loads(text).get("files", [])
            allowed |= {str(n) for n in listed}
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    foreign = sorted(entries - allowed)
    if foreign:
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise ConfigError(f"output folder {out} holds files recommender did not write ({shown}); "
                          f"give a new or empty folder (the whole folder is replaced)")


def write_file_set(out_dir: str | Path, files: Mapping[str, str], *, executable: Callable[[str], bool] | None = None,
                   label: str = "") -> list[Path]:
    """Write ``files`` (name -> text) as ONE set: ``out_dir`` holds either the old set or the new one, never a mix.

    The files and a manifest (:data:`SET_MANIFEST`, written last) go to a temp folder beside ``out_dir``, which is
    then swapped in with one atomic rename (Linux ``renameat2(RENAME_EXCHANGE)`` when ``out_dir`` exists; elsewhere
    rename old away, rename new in). The old set is deleted afterwards; temp folders of killed runs are deleted
    by the next run. ``out_dir`` may be missing, empty, or a set written before; anything else is refused.
    """
    is_exec = executable or (lambda n: n.endswith(".sh"))
    for name in files:
        if not name or "/" in name or name.startswith(".") or name == SET_MANIFEST:
            raise ValueError(f"bad output file name {name!r}")
    out = Path(out_dir)
    if out.is_symlink():
        out = out.resolve()
    out = Path(os.path.abspath(out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output folder {out} exists and is not a folder; give a folder path")
    if out.is_dir():
        _replaceable(out, set(files))
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(parent, out.name)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.set-{os.getpid()}-"))
    try:
        for name, text in files.items():
            target = tmp / name
            with open(target, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(target, 0o755 if is_exec(name) else 0o644)
        manifest = {"written_by": "recommender", "label": label, "files": sorted(files)}
        with open(tmp / SET_MANIFEST, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        old_mode = out.stat().st_mode & 0o7777 if out.is_dir() else None
        if old_mode is None:
            umask = os.umask(0)
            os.umask(umask)
            old_mode = 0o777 & ~umask
        os.chmod(tmp, old_mode)
        _fsync_dir(tmp)
        if not out.exists():
            os.rename(tmp, out)  # fails if another writer created out meanwhile: nothing mixed
        elif _exchange(tmp, out):
            shutil.rmtree(tmp, ignore_errors=True)  # now holds the old set
        else:
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.set-{os.getpid()}-old-"))
            os.rename(out, old / "x")
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(parent)
    return [out / name for name in files]
