"""Refuse a write that cannot fit before it starts.

A file system that fills up while numpy writes into a memory map kills the process with SIGBUS (no Python
error, no cleanup), and netCDF-C can crash the same way. So a builder asks first: `require_free_space` raises
an OSError with errno ENOSPC and the file name, whose message says how much is needed, how much is free, and how
to fix it. `reserve` then allocates the blocks of a file that will be written through a memory map, so a disk
that fills up meanwhile fails there with the same error instead of a SIGBUS later.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

MARGIN_BYTES = 16 * 2**20  # room left over: file-system metadata, the sidecar, other writers' small files
MARGIN_FRACTION = 0.01


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def needed_bytes(nbytes: int) -> int:
    """What a write of `nbytes` asks to be free: the bytes plus a margin."""
    return int(nbytes + MARGIN_BYTES + MARGIN_FRACTION * nbytes)


def no_space(folder: Path, filename: str | os.PathLike, nbytes: int, free: int, how: str) -> OSError:
    """The one-line ENOSPC error: folder, bytes needed (with the margin) and free, and how to fix it."""
    return OSError(
        errno.ENOSPC,
        f"not enough free space in {folder}: writing {Path(filename).name} needs {_mb(needed_bytes(nbytes))} "
        f"({_mb(nbytes)} plus a margin), {_mb(free)} is free; {how}",
        os.fspath(filename),
    )


def require_free_space(filename: str | os.PathLike, nbytes: int, how: str) -> None:
    """Raise OSError(ENOSPC, ..., filename) unless the folder of `filename` has `nbytes` plus a margin free.

    `how` ends the message: what the user can do (free space, or the flag / variable that moves the file)."""
    folder = Path(filename).parent
    free = int(shutil.disk_usage(folder).free)
    if free < needed_bytes(nbytes):
        raise no_space(folder, filename, nbytes, free, how)


def reserve(path: str | os.PathLike, nbytes: int, filename: str | os.PathLike, how: str) -> None:
    """Allocate the first `nbytes` of the existing file `path` on disk (posix_fallocate), so writes through a
    memory map cannot hit a full disk; a full disk is the OSError of `require_free_space`, naming `filename`.
    Where the platform or file system cannot allocate ahead, this does nothing."""
    if not hasattr(os, "posix_fallocate") or nbytes <= 0:
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            folder = Path(path).parent
            raise no_space(folder, filename, nbytes, int(shutil.disk_usage(folder).free), how) from e
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


def make_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    """The cache folder (`cache_dir`, else $PLAINLOOP_CACHE, else ~/.cache/plainloop), made if missing. One that
    cannot be made is an OSError naming the folder and where it came from (the error's cause keeps the errno)."""
    env = os.environ.get("PLAINLOOP_CACHE")
    cache = Path(cache_dir) if cache_dir is not None else Path(env or Path.home() / ".cache" / "plainloop")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        where = "--cache_dir (cache_dir=)" if cache_dir is not None else "$PLAINLOOP_CACHE" if env else "the default"
        raise OSError(
            f"cache folder {cache} ({where}) cannot be made: {e.strerror or e}; point --cache_dir or $PLAINLOOP_CACHE "
            f"at a folder you can write"
        ) from e
    return cache
