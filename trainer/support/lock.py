"""An exclusive lock on a directory for a process's lifetime, the owner it records, and whether a directory can
be written at all."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import weakref
from pathlib import Path

from .files import StorageError, atomic_write_text

WAIT = "wait for it to end"  # what a process refused by a live lock can do (the caller may say more)


class RunDirError(ValueError):
    """The run directory cannot be used (taken by a live process, or not a run)."""


class RunDirGone(StorageError):
    """The run directory was removed or replaced while this process trained it: the run stops (exit code 4)."""


def busy_error(run_dir: Path, fix: str = WAIT) -> RunDirError:
    """The refusal of a second process on `run_dir`, naming the owner its .lock records."""
    owner = _recorded_owner(Path(run_dir) / ".lock")
    holder = f"(pid {owner[0]})" + (f" on {owner[1]}" if owner[1] else "") if owner else "(pid unknown)"
    return RunDirError(f"{run_dir} is being written by another live process {holder}; {fix}")


def _recorded_owner(path: Path) -> tuple[int, str] | None:
    """(pid, host) that RUN_DIR/.lock names, if it names one."""
    try:
        parts = path.read_text(encoding="utf-8", errors="replace").split()
        return int(parts[0]), parts[1] if len(parts) > 1 else ""
    except (OSError, ValueError, IndexError):
        return None


def _try_lock(fd: int) -> None:
    """An exclusive lock on `fd` without waiting (OSError when another process holds it)."""
    if os.name == "nt":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


_BUSY = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES, errno.EDEADLK}  # another process holds the lock


class RunLock:
    """An exclusive lock on the run directory for this process's lifetime (released at exit, also on kill -9).

    The lock is an flock on the directory itself, so deleting RUN_DIR/.lock (a "stale" lock, to a user) cannot let a
    second process in; .lock only records the owner (pid and host) for the messages. Where a directory cannot be
    locked (Windows; some network file systems) the lock is on .lock itself, and `check()` also verifies that .lock
    is still the file locked.
    """

    def __init__(self, run_dir: Path, record: bool = True, fix: str = WAIT) -> None:
        self.run_dir, self.path, self.note = Path(run_dir), Path(run_dir) / ".lock", None
        self.on_file = os.name == "nt"
        while True:
            if self.on_file:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT)
            else:
                fd = os.open(self.run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                _try_lock(fd)
                break
            except OSError as e:
                os.close(fd)
                if e.errno in _BUSY or self.on_file:
                    raise busy_error(self.run_dir, fix) from None
                self.on_file = True  # the file system cannot lock a directory: lock .lock, verified by inode
        self.identity = os.stat(self.run_dir)
        self.file_identity = os.fstat(fd) if self.on_file else None
        if record:  # the owner, for the messages: a dead owner's lock was released with it and is taken over here
            before = _recorded_owner(self.path)
            if before is not None and before[0] != os.getpid():
                where = f" on {before[1]}" if before[1] else ""
                self.note = f"run dir: took over the lock of pid {before[0]}{where}, which ended without releasing it"
            owner = f"{os.getpid()} {socket.gethostname()}\n"
            with contextlib.suppress(OSError):  # the record is for messages only; the lock is what holds
                if self.on_file:  # into the locked file itself: a replaced file would be another lock
                    os.ftruncate(fd, 0)
                    os.lseek(fd, 0, os.SEEK_SET)
                    os.write(fd, owner.encode())  # not os.pwrite: Windows, where this path runs, has none
                else:
                    atomic_write_text(self.path, owner)
        # a lock nobody released (a Trainer dropped without fit, interpreter exit) is released, not left open
        self._finalizer = weakref.finalize(
            self, RunLock._unlock, fd, os.getpid(), self.path if record else None, self.on_file
        )

    @staticmethod
    def _unlock(fd: int, owner: int, record: Path | None, on_file: bool) -> None:
        if os.getpid() != owner:  # a forked child shares the lock: only its owner may let it go
            return
        if record is not None and _recorded_owner(record) == (owner, socket.gethostname()):
            # released in order: a record left behind names a process that died (a locked .lock is emptied, not
            # unlinked: another process may be waiting on that very file)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0) if on_file else record.unlink()
        if os.name != "nt":  # unlock explicitly: forked loader workers share this descriptor and outlive close()
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def check(self, writing: str) -> None:
        """Raise RunDirGone when the run directory (or, locked by file, its .lock) was removed or replaced since it
        was locked (before `writing`, a name inside it: the path is built only for the message)."""
        try:
            same = os.path.samestat(os.stat(self.run_dir), self.identity) and (
                self.file_identity is None or os.path.samestat(os.stat(self.path), self.file_identity)
            )
        except OSError:
            same = False
        if not same:
            raise RunDirGone(
                f"the run directory {self.run_dir} (or its .lock) was removed or replaced while this run was writing "
                f"it: stopped before writing {self.run_dir / writing} (nothing recreated); start a new run, or resume "
                f"from a copy",
                errno.ENOENT,
                self.run_dir,
            )

    def release(self) -> None:
        self._finalizer()


def writable_dir_problem(path: str | os.PathLike) -> str | None:
    """Why a run could not write under directory `path` (created if missing), or None. Checked before anything
    is written, so a file in the way, a read-only or full file system is one line instead of a traceback."""
    p = Path(os.path.abspath(path))
    if any(len(os.fsencode(part)) > 255 for part in p.parts):
        return "a name in it is longer than 255 bytes, more than file systems allow"
    cur = p
    while not os.path.lexists(cur) and cur != cur.parent:
        cur = cur.parent
    if not cur.is_dir():
        return "exists and is not a directory" if cur == p else f"lies under {cur}, which is not a directory"
    if not os.access(cur, os.W_OK | os.X_OK):
        return f"{'it' if cur == p else cur} is not writable (permissions or a read-only file system)"
    try:
        usage = shutil.disk_usage(cur)
    except OSError:
        return None
    if usage.total == 0:  # /proc, /sys: root may write there, but no file of a run's
        return f"{cur} is on a pseudo file system (size 0, like /proc or /sys), not a disk: choose a folder on a disk"
    if usage.free < 16 * 2**20:  # a small empty file system is not "full": say both sizes
        return (
            f"the file system of {cur} has {usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB; a run "
            f"needs at least 16 MiB free: free space there or choose another folder"
        )
    return None


# writable_dir_problem's problems of the storage (exit code 4, as a full disk during the run), not of the path (2)
STORAGE_PROBLEMS = {"is not writable": errno.EACCES, "MiB free of": errno.ENOSPC}
