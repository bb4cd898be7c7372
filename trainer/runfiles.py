"""The run directory: claimed atomically, locked while a process writes it, and its files.

    OUTPUT_DIR/RUN_NAME/  config.json  config.toml  metrics.jsonl  summary.json  checkpoints/{last,best}.pt

A run never writes into another run's directory: a name that exists gets a -2, -3 ... suffix (claimed with an
atomic mkdir, so simultaneous launches cannot share one), and a lock file makes a second live process on the
same directory fail with a clear message.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .checkpoint import remove_orphan_temps
from .setup import Runtime


class RunDirError(ValueError):
    """The run directory cannot be used (taken by a live process, or not a run)."""


def claim_run_dir(output_dir: str | Path, name: str | None, prefix: str) -> tuple[Path, str | None]:
    """Create and return a fresh run directory; (path, note when the name had to change)."""
    base = name or f"{prefix}-{datetime.now():%Y%m%d-%H%M%S}"
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        cand = root / (base if i == 1 else f"{base}-{i}")
        try:
            cand.mkdir()  # atomic: of two simultaneous launches exactly one gets each name
        except FileExistsError:
            if i == 1 and name is not None and _unused(cand):
                why = (
                    "it holds the profiler's trace, profile/, and no checkpoint: training writes beside it"
                    if (cand / "profile").is_dir()  # --profile --profile_then_train: its own profiling pass
                    else "an earlier start left no checkpoint and no summary there"
                )
                return cand, f"run dir: reusing {cand} ({why})"
            continue
        note = None
        if name is not None and i > 1:
            note = (
                f"run dir: {root / base} already holds a run; writing to {cand} instead (to continue that run, "
                f"resume from it: --resume {root / base}, or BaseTrainer(checkpoint_path=...))"
            )
        return cand, note
    raise RunDirError(f"no free run directory name under {root} for {base!r}")


def _unused(run_dir: Path) -> bool:
    """A directory a run started in but left nothing to lose in: no checkpoint, no summary, no live writer."""
    if (run_dir / "summary.json").exists() or any((run_dir / "checkpoints").glob("*.pt")):
        return False
    try:
        RunLock(run_dir).release()
    except (RunDirError, OSError):
        return False
    return True


def find_resumable(output_dir: str | Path, prefix: str) -> Path | None:
    """The newest run directory under output_dir named <prefix>-... that holds checkpoints/last.pt and has not
    finished (a finished run has nothing left to train: resuming it would only be an error)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = [
        p
        for p in root.iterdir()
        if p.name.startswith(f"{prefix}-") and (p / "checkpoints/last.pt").is_file() and not finished(p)
    ]
    return max(runs, key=lambda p: (p / "checkpoints/last.pt").stat().st_mtime, default=None)


def finished(run_dir: Path) -> bool:
    """summary.json written at the end of training (not by a stop signal), and no checkpoint since: a run that
    was extended (--resume with more --epochs) and then killed has a newer last.pt and counts as unfinished."""
    summary, last = run_dir / "summary.json", run_dir / "checkpoints" / "last.pt"
    try:
        if summary.stat().st_mtime_ns < last.stat().st_mtime_ns:
            return False
        return "stopped_by" not in json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


class RunLock:
    """An exclusive lock on RUN_DIR/.lock for this process's lifetime (released at exit, also on kill -9)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ".lock"
        self._fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held open while the run lives)
        try:
            if os.name == "nt":
                import msvcrt

                msvcrt.locking(self._fh.fileno(), msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
            else:
                import fcntl

                fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "unknown"
            self._fh.close()
            raise RunDirError(
                f"{run_dir} is being written by another live process (pid {holder}); wait for it, "
                f"or use another --run_name"
            ) from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()

    def release(self) -> None:
        if self._fh.closed:
            return
        if os.name != "nt":  # unlock explicitly: forked loader workers share this descriptor and outlive close()
            import fcntl

            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()


ROLLED_BACK = "metrics.rolled_back.jsonl"


def roll_back_metrics(run_dir: Path, step: int, val_pending: bool = False) -> int:
    """Resuming from a checkpoint at `step`: rows a killed process wrote after it are trained again, so they move
    from metrics.jsonl to metrics.rolled_back.jsonl (kept, never deleted), as does a line torn by the kill. With
    `val_pending` (the checkpoint came right before a validation, which the resume runs again) a val row at `step`
    moves too. Returns how many lines moved."""
    path = run_dir / "metrics.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    keep: list[str] = []
    moved: list[str] = []
    for line in lines:
        try:
            row = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            row = None
        s = row.get("step") if isinstance(row, dict) else None
        ok = isinstance(row, dict) and (not isinstance(s, int) or s <= step)
        if ok and val_pending and s == step and isinstance(row, dict) and row.get("kind") == "val":
            ok = False
        (keep if ok else moved).append(line if line.endswith("\n") else line + "\n")
    if moved:
        with open(run_dir / ROLLED_BACK, "a", encoding="utf-8") as fh:
            fh.writelines(moved)
            fh.flush()
            os.fsync(fh.fileno())
        tmp = run_dir / ".metrics.jsonl.tmp"
        tmp.write_text("".join(keep), encoding="utf-8")
        os.replace(tmp, path)
    return len(moved)


def shared_run_dir(
    run_dir: Path | None, output_dir: str | Path, name: str | None, prefix: str, rt: Runtime
) -> tuple[Path, str | None]:
    """The run directory every rank writes to: `run_dir` when resuming one, else one rank 0 claims (and
    broadcasts); (path, note when the name had to change)."""
    note = None
    if run_dir is None:
        if rt.is_main:
            run_dir, note = claim_run_dir(output_dir, name, prefix)
        if rt.distributed:  # every rank must agree on one directory
            box = [run_dir]
            dist.broadcast_object_list(box, src=0)
            run_dir = box[0]
    assert run_dir is not None
    return Path(run_dir), note


class RunFiles:
    """Writes config, metrics rows and the summary of one run (rank 0 only); `on_row` sees every metrics row."""

    def __init__(
        self,
        run_dir: Path,
        on_row: Callable[[dict[str, Any]], None] | None = None,
        resumed_step: int | None = None,
        val_pending: bool = False,
    ) -> None:
        self.run_dir, self.on_row = run_dir, on_row
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(run_dir)
        self.removed = remove_orphan_temps(run_dir / "checkpoints") + remove_orphan_temps(run_dir)
        self.rolled_back = 0 if resumed_step is None else roll_back_metrics(run_dir, resumed_step, val_pending)
        self._metrics = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def write_json(self, name: str, obj: Any) -> None:
        tmp = self.run_dir / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
        os.replace(tmp, self.run_dir / name)

    def log(self, row: dict[str, Any]) -> None:
        row.setdefault("time", time.time())  # wall clock, so rows line up with other logs
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self.on_row is not None:
            self.on_row(row)

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()
        self.lock.release()
