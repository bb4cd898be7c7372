"""Files written whole or not at all, and the storage errors that name them.

- `atomic_write` writes a temp file beside the target, fsyncs and renames it: a crash never leaves half a file.
- `remove_orphan_temps` deletes the temps a killed writer left behind (a live writer's are never touched).
- `strict_json` and `write_toml` write what a run's JSON and TOML files hold.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

# errors of the storage, not of the input: a full disk, a quota, a failing device, a read-only or forbidden place
STORAGE_ERRNOS = frozenset(
    getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EIO", "EROFS", "EACCES", "EPERM") if hasattr(errno, n)
)


class StorageError(OSError):
    """Writing a run's file failed because of the storage (a full disk, no permission, a vanished folder); the
    message names the file and says what was kept. The command line exits with code 4 on it."""

    def __init__(self, message: str, err: int | None = None, filename: str | os.PathLike | None = None) -> None:
        super().__init__(err or errno.EIO, message)
        self.message = message
        self.filename = str(filename) if filename is not None else None

    def __str__(self) -> str:
        return self.message


def storage_error(path: str | os.PathLike, e: OSError, what: str = "writing") -> StorageError:
    """`e` (raised while writing `path`) as one line that names the file and the cause."""
    why = e.strerror or str(e) or type(e).__name__
    if isinstance(e, FileNotFoundError) or e.errno == errno.ENOENT:
        why = f"its folder {Path(path).parent} is gone (removed while the run was writing it)"
    return StorageError(f"{what} {path} failed: {why}", e.errno, path)


def check_free_space(path: str | os.PathLike, needed: int) -> None:
    """Refuse a write of about `needed` bytes into `path`'s folder when the disk has less free (cheap: one statvfs);
    the file there now is kept."""
    folder = Path(path).parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # the write itself reports a missing folder, with the file's name
        return
    if free < needed + 2**20:
        raise StorageError(
            f"writing {path} needs about {needed / 2**20:.1f} MB and {folder} has {free / 2**20:.1f} MB free: "
            f"nothing written, the previous file is kept; free some space (or write to another disk), then resume",
            errno.ENOSPC,
            path,
        )


def _owner_tag() -> str:
    """host~pid of this writer, embedded in temp names so `remove_orphan_temps` can tell live from dead."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40]
    return f"{host}~{os.getpid()}"


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """`write(file)` into a temp file beside `path`, fsync, rename, fsync the folder: the file is whole or not there.
    Temps are named .NAME.host~pid.*.tmp, so `remove_orphan_temps` can tell a dead writer's from a live one's."""
    path = Path(path)
    if path.is_dir():  # os.replace would say "Is a directory" without saying which
        raise StorageError(
            f"cannot write {path}: a directory is in its place; move that directory away, then run again",
            errno.EISDIR,
            path,
        )
    tmp = path.parent / f".{path.name}.{_owner_tag()}.{os.urandom(6).hex()}.tmp"
    try:  # created as open() creates a file (mode 0666 less the umask, where mkstemp gives 0600), never over one
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as e:
        raise storage_error(path, e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):  # a full disk, a quota, a vanished folder: one line naming the file
            raise storage_error(path, e) from e
        raise
    if hasattr(os, "O_DIRECTORY"):  # the rename itself survives a power cut once the folder is synced (not Windows)
        with contextlib.suppress(OSError):  # some file systems refuse a folder fsync; the file is already on disk
            dfd = os.open(path.parent, os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write a file whole or not at all: a temp file beside it, fsync, rename. A kill or a bad value mid-write
    leaves the previous file (never an empty one, which a resume would read as "no settings")."""
    data = text.encode("utf-8")  # fails before anything is touched when the text cannot be written
    return atomic_write(path, lambda fh: fh.write(data))


# ------------------------------------------------------------------------------------------ orphan temps

# .<target>.<host>~<pid>.<random>.tmp from atomic_save; older writers had no host~pid part
_TEMP_RE = re.compile(r"^\.(?P<target>.+?)\.(?:(?P<host>[A-Za-z0-9_-]*)~(?P<pid>\d+)\.)?[A-Za-z0-9_]+\.tmp$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True  # os.kill(pid, 0) would terminate the process on Windows: leave it to the age rule
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    try:  # a zombie (killed, not yet reaped) writes nothing any more
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return True


def remove_orphan_temps(folder: str | os.PathLike, max_age_s: float = 900.0) -> list[Path]:
    """Delete `.<name>.*.tmp` files that a killed `atomic_save` left in `folder`; return what was removed.

    A temp file is removed when its writer (host~pid in the name) is this host's process that no longer runs,
    or when nothing has written to it for `max_age_s` seconds (writers on other hosts, older names). A live
    writer's file is never touched: it keeps writing, so its modification time stays fresh.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    me = _owner_tag().split("~")[0]
    now = time.time()
    removed: list[Path] = []
    for p in folder.iterdir():
        m = _TEMP_RE.match(p.name)
        if not m or not p.is_file():
            continue
        try:
            age = now - p.stat().st_mtime
        except FileNotFoundError:  # renamed or removed by its writer meanwhile
            continue
        dead_writer = m["pid"] is not None and m["host"] == me and not _pid_alive(int(m["pid"]))
        if dead_writer or age > max_age_s:
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed.append(p)
    return removed


_PLAIN = frozenset({str, int, bool, type(None)})  # JSON as they are: no look inside, no key path built


def strict_json(obj: Any, bad: list[str], where: str = "") -> Any:
    """`obj` with every non-finite float replaced by None; the dotted keys of those go to `bad`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        bad.append(where or "value")
        return None
    if isinstance(obj, dict):  # a metrics row: its numbers pass without a call each (a row per log point)
        return {
            k: v
            if (t := type(v)) in _PLAIN or (t is float and math.isfinite(v))
            else strict_json(v, bad, f"{where}.{k}" if where else str(k))
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [strict_json(v, bad, f"{where}[{i}]") for i, v in enumerate(obj)]
    return obj


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v) if math.isfinite(v) else json.dumps(str(v))
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def write_config_file(path: str | Path, sections: dict[str, dict[str, Any]], header: str = "") -> Path:
    """Write {table: {key: value}} as TOML that `load_config_file` reads back; None values are left out."""
    lines = [f"# {h}" for h in header.splitlines()] + [""] if header else []
    for table, values in sections.items():
        lines.append(f"[{table}]")
        for k, v in values.items():
            lines.append(f"{k} = {_toml_value(v)}" if v is not None else f"# {k}: unset")
        lines.append("")
    return atomic_write_text(path, "\n".join(lines))


def move_jsonl_rows(path: Path, target: Path, moves: Callable[[dict[str, Any]], bool], junk: list[int]) -> int:
    """Move the rows of a JSON-lines file for which `moves(row)` holds to `target` (appended, fsynced), then
    rewrite `path` whole with the others. A line that is not a JSON object (damaged bytes, not UTF-8) moves as it
    is, its line number to `junk`; a last line without its newline (torn by a kill) moves too. Returns how many
    rows moved, junk lines not counted."""
    try:
        with open(path, "rb") as f:
            lines = f.readlines()  # binary: rows end in \n alone (a \r is part of a row)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise storage_error(path, e, "reading") from e
    keep: list[bytes] = []
    moved: list[bytes] = []
    moved_rows = 0
    for i, raw in enumerate(lines, 1):
        try:
            row = json.loads(raw.decode("utf-8")) if raw.endswith(b"\n") else None
        except ValueError:  # UnicodeDecodeError too
            row = None
        if isinstance(row, dict):
            if moves(row):
                moved_rows += 1
                moved.append(raw)
            else:
                keep.append(raw)
        elif raw.endswith(b"\n"):  # damaged bytes
            junk.append(i)
            moved.append(raw)
        else:  # the last line, torn by the kill
            moved_rows += 1
            moved.append(raw + b"\n")
    if moved:
        try:
            with open(target, "ab") as fh:
                fh.writelines(moved)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as e:
            raise storage_error(target, e) from e
        atomic_write(path, lambda fh: fh.write(b"".join(keep)))
    return moved_rows
