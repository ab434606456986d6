"""Crash-safe file output.

* ``atomic_write_text`` (from ``recommender.atomic``, the one single-file writer): temp file, fsync,
  ``os.replace``; a reader (or a crash) sees either the old file or the complete new one, never half of it.
* ``write_file_set``: several files that belong together (a plan and its deployment files): written into a temp
  folder and swapped in as a whole, so a reader never sees files of two plans side by side. It never removes
  or replaces what it did not write: an existing folder is replaced only when every entry in it is a regular
  file its manifest (:data:`SET_MANIFEST`) records, unchanged (the manifest keeps each file's SHA-256); a
  directory, symlink, FIFO, socket or device there (say a folder named ``k8s.yaml``), an unrecorded file, or
  an edited one, is refused in one line before anything is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from recommender.atomic import atomic_write_text
from recommender.errors import ConfigError

__all__ = ["SET_MANIFEST", "atomic_write_text", "write_file_set"]


# --------------------------------------------------------------------------- file sets

#: hidden file in every written set: which files belong to it (written last, so its presence means complete)
SET_MANIFEST = ".recommender-files.json"
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


#: largest manifest read (it lists a handful of names; anything bigger was not written by us)
_MANIFEST_MAX_BYTES = 1 << 20
#: largest recorded file hashed to see whether it was edited (deployment files are kilobytes)
_FILE_MAX_BYTES = 256 << 20


def _kind(st: os.stat_result) -> str:
    """What a path is, in words, for the refusal message."""
    m = st.st_mode
    if stat.S_ISLNK(m):
        return "a symlink"
    if stat.S_ISDIR(m):
        return "a directory"
    if stat.S_ISFIFO(m):
        return "a FIFO"
    if stat.S_ISSOCK(m):
        return "a socket"
    if stat.S_ISCHR(m) or stat.S_ISBLK(m):
        return "a device"
    return "a special file" if not stat.S_ISREG(m) else "a file"


def _refuse(out: Path, what: str) -> ConfigError:
    return ConfigError(f"output folder {out} holds {what}, which recommender did not write; nothing was written: "
                       f"the output replaces the whole folder, so give a new or empty folder or move that away")


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file (no symlink followed, no FIFO waited on); OSError/ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit:,} bytes")
    return data


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _recorded(out: Path, shown: Path) -> dict[str, str | None]:
    """What the folder's manifest records: name -> SHA-256 of the bytes written (None in manifests older than
    the hashes); {} without a manifest. A manifest that is not a regular file, or not one we wrote, is refused
    (reading a FIFO would block, a symlink could point anywhere); the refusal names the folder ``shown``."""
    path = out / SET_MANIFEST
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(shown, f"{_kind(st)} named {SET_MANIFEST}")
    if st.st_size > _MANIFEST_MAX_BYTES:
        raise _refuse(shown, f"a {st.st_size:,}-byte {SET_MANIFEST}")
    try:
        doc = json.loads(_read_regular(path, _MANIFEST_MAX_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        raise _refuse(shown, f"an unreadable {SET_MANIFEST}") from None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("written_by") == "recommender" else None
    if not isinstance(files, list) or not all(isinstance(n, str) for n in files):
        raise _refuse(shown, f"a {SET_MANIFEST} recommender did not write")
    hashes = doc.get("sha256")
    hashes = hashes if isinstance(hashes, dict) else {}
    return {n: (str(hashes[n]) if n in hashes else None) for n in files}


def _replaceable(out: Path, named: Path | None = None) -> None:
    """Refuse (one-line ConfigError, before anything is written) a folder whose contents recommender did not
    write: every entry must be the manifest or a REGULAR file the manifest records, with the bytes it
    recorded (SHA-256). A directory, symlink, FIFO, socket or device (named like an output file or not), a
    file the manifest does not record, or one edited since, would be deleted by the swap, so it stops the
    write. ``named``: the path the message names (the output folder, when ``out`` is its swapped-out copy)."""
    shown = named or out
    recorded = _recorded(out, shown)
    problems: list[str] = []
    for p in sorted(out.iterdir()):
        if p.name == SET_MANIFEST:
            continue
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{p.name} ({_kind(st)})")
        elif p.name not in recorded:
            problems.append(f"{p.name} (a file no recommender manifest there records)")
        elif recorded[p.name] is not None:
            try:
                same = _sha256(_read_regular(p, _FILE_MAX_BYTES)) == recorded[p.name]
            except (OSError, ValueError):
                same = False
            if not same:
                problems.append(f"{p.name} (edited since recommender wrote it)")
    if problems:
        listed = ", ".join(problems[:3]) + (f" and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise _refuse(shown, listed)


def write_file_set(out_dir: str | Path, files: Mapping[str, str], *, executable: Callable[[str], bool] | None = None,
                   label: str = "") -> list[Path]:
    """Write ``files`` (name -> text) as ONE set: ``out_dir`` holds either the old set or the new one, never a mix.

    The files and a manifest (:data:`SET_MANIFEST`, written last) go to a temp folder beside ``out_dir``, which is
    then swapped in with one atomic rename (Linux ``renameat2(RENAME_EXCHANGE)`` when ``out_dir`` exists; elsewhere
    rename old away, rename new in). The old set is deleted afterwards; temp folders of killed runs are deleted
    by the next run. ``out_dir`` may be missing, empty, or a set written before (every entry a regular file
    its manifest records, unedited); anything else is refused in one line before anything is written, and checked again
    on the swapped-out folder before it is deleted (an entry that arrived in between puts the folder back).
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
        _replaceable(out)
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
        manifest = {"written_by": "recommender", "label": label, "files": sorted(files),
                    "sha256": {n: _sha256(files[n].encode("utf-8")) for n in sorted(files)}}
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
            try:  # tmp now holds the old set: checked again, in case something arrived after the first check
                _replaceable(tmp, out)
            except ConfigError:
                _exchange(tmp, out)  # put the folder back as it was; tmp holds our new set again
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.set-{os.getpid()}-old-"))
            os.rename(out, old / "x")
            try:
                _replaceable(old / "x", out)
            except ConfigError:
                os.rename(old / "x", out)
                old.rmdir()
                raise
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(parent)
    return [out / name for name in files]
