"""The run directory: claimed atomically, locked while a process writes it, and its files.

    OUTPUT_DIR/RUN_NAME/  config.json  config.toml  metrics.jsonl  summary.json  checkpoints/{last,best}.pt

A run never writes into another run's directory: a name that exists gets a -2, -3 ... suffix (claimed with an
atomic mkdir, so simultaneous launches cannot share one), and a lock on the directory itself (not on a file in it,
which a user can delete) makes a second live process on the same directory fail with a clear message. Before each
write the run checks that its directory is still the one it locked: one removed or replaced stops the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_checkpoint
from .config import TrainConfig, run_name_problem
from .runtime import Runtime
from .support import (
    RunDirError,
    RunDirGone,
    RunLock,
    atomic_write_text,
    busy_error,
    move_jsonl_rows,
    remove_orphan_temps,
    storage_error,
    strict_json,
    writable_dir_problem,
    write_config_file,
)
from .usercode import resume_hint

__all__ = [  # the leaf's lock and writers are public here too (trainer.runfiles.RunLock, write_config_file)
    "MARKER", "ROLLED_BACK", "WAIT_OR_RENAME", "WAIT_THEN_RESUME", "RunDirError", "RunDirGone", "RunFiles",
    "RunLock", "busy_error", "check_not_live", "claim_run_dir", "find_resumable", "finished", "held_by_live_process", "is_run_dir", "newest_readable", "refuse_if_live",
    "resolve_resume", "resume_auto", "roll_back_metrics", "shared_run_dir", "strict_json", "write_config_file",
]  # fmt: skip


MARKER = ".plainloop-run"  # written into a claimed directory while its lock is held: "this is a plainloop run"
_HELD: dict[str, RunLock] = {}  # run directories this process has claimed and locked, until RunFiles takes over


def claim_run_dir(output_dir: str | Path, name: str | None, prefix: str) -> tuple[Path, str | None]:
    """Create (or take over an unused one of ours), lock and mark a run directory; (path, note when the name had
    to change). The lock is taken before the marker is written, so a directory another launch has just created
    but not yet locked is never taken: it is not marked yet, and once marked its lock is held."""
    if name is not None and (why := run_name_problem(name)):
        raise RunDirError(f"run name {name!r}: {why}")  # checked by TrainConfig too: this covers direct callers
    base = name or f"{prefix}-{datetime.now():%Y%m%d-%H%M%S}"
    root = Path(output_dir)
    if why := writable_dir_problem(root):
        raise RunDirError(f"output directory {root}: {why}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for i in range(1, 10_000):
            cand = root / (base if i == 1 else f"{base}-{i}")
            try:
                cand.mkdir()  # atomic: of two simultaneous launches exactly one gets each name
            except FileExistsError:
                if i == 1 and name is not None and _take_if_unused(cand):
                    why = (
                        "it holds the profiler's trace, profile/, and no checkpoint: training writes beside it"
                        if (cand / "profile").is_dir()  # --profile --profile_then_train: its own profiling pass
                        else "an earlier start left no checkpoint and no summary there"
                    )
                    return cand, f"run dir: reusing {cand} ({why})"
                continue
            _HELD[str(cand.resolve())] = RunLock(cand, fix=WAIT_OR_RENAME)
            _mark(cand)
            if name is None or i == 1:
                return cand, None
            taken = root / base
            if is_run_dir(taken) and held_by_live_process(taken):  # (is_run_dir: no lock file in a folder of yours)
                return cand, f"run dir: {taken} is being written by another live process; writing to {cand} instead"
            return cand, (
                f"run dir: {taken} already holds a run or is not a plainloop run; writing to {cand} "
                f"instead (to continue that run, resume from it: {resume_hint(taken)})"
            )
    except OSError as e:  # a read-only or full file system, a name the file system refuses
        raise RunDirError(f"output directory {root}: cannot create a run directory there ({e.strerror or e})") from None
    raise RunDirError(f"no free run directory name under {root} for {base!r}")


def _mark(run_dir: Path) -> None:
    atomic_write_text(run_dir / MARKER, f"{os.getpid()}\n")  # its temp is removed on any failure


def is_run_dir(run_dir: Path) -> bool:
    """A directory plainloop made: its marker, or (runs from before the marker) a config.json of ours."""
    if (run_dir / MARKER).is_file():
        return True
    try:
        cfg = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and {"requested", "effective", "runtime"} <= set(cfg)


def _take_if_unused(run_dir: Path) -> bool:
    """Lock `run_dir` for this process if it is a plainloop run that an earlier start left with nothing to lose
    (no checkpoint, no summary, no live writer); a directory of the user's is never taken."""
    key = str(run_dir.resolve())
    if key in _HELD:  # this process claimed it (the profiler's pass before training)
        return True
    if not is_run_dir(run_dir) or (run_dir / "summary.json").exists() or any((run_dir / "checkpoints").glob("*.pt")):
        return False
    try:
        _HELD[key] = RunLock(run_dir, fix=WAIT_OR_RENAME)
    except (RunDirError, OSError):
        return False
    _mark(run_dir)
    return True


def held_by_live_process(run_dir: Path) -> bool:
    try:
        check_not_live(run_dir)
    except RunDirError:
        return True
    return False


# what a process refused by a live run's lock can do about it
WAIT_OR_RENAME = "wait for it, or use another --run_name"
WAIT_THEN_RESUME = (
    "wait for it to end (a stop signal to it writes last.pt), then resume; or start a new run with another run_name"
)


PROBES = 5  # tries of a busy lock before its run is taken as live


def check_not_live(run_dir: Path, fix: str = WAIT_OR_RENAME) -> None:
    """Raise RunDirError ("RUN_DIR is being written by another live process (pid N); `fix`") when another live
    process holds the lock of `run_dir`; the lock is only tried, never kept. A directory this process holds passes."""
    if str(run_dir.resolve()) in _HELD:  # held by this process
        return
    for attempt in range(PROBES):
        try:
            RunLock(run_dir, record=False).release()
            return
        except RunDirError:
            if attempt == PROBES - 1:
                raise busy_error(run_dir, fix) from None
            # another process's probe (a torchrun rank's --resume auto) holds the lock for microseconds, a live
            # run for good: try again before calling it live, or two probing ranks could pick different runs
            time.sleep(0.01 * (1 + random.random()))
        except OSError:  # a directory that cannot be opened: the resume or the claim reports it
            return


def refuse_if_live(run_dir: Path, fix: str = WAIT_THEN_RESUME, main: bool | None = None) -> None:
    """check_not_live for a resume target before its last.pt is looked for (a live run may have none yet): only a
    run's folder (no lock file in a user's), only on rank 0 (None: torchrun's RANK), as ranks trying one lock at
    once would each see the other as live."""
    main = int(os.environ.get("RANK", "0")) == 0 if main is None else main
    if main and run_dir.is_dir() and ((run_dir / "checkpoints").is_dir() or is_run_dir(run_dir)):
        check_not_live(run_dir, fix)


def find_resumable(output_dir: str | Path, prefix: str, notes: list[str] | None = None) -> Path | None:
    """The newest run directory under output_dir named <prefix>-... that holds a readable checkpoints/last.pt, has
    not finished (a finished run has nothing left to train) and is not being trained by a live process. A run whose
    last.pt cannot be read is passed over, with a line in `notes` (else every `--resume auto` would pick it)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = [
        p
        for p in root.iterdir()
        if p.name.startswith(f"{prefix}-")
        and (p / "checkpoints/last.pt").is_file()
        and not finished(p)
        and not held_by_live_process(p)
    ]
    return newest_readable(runs, notes)


def resume_auto(
    output_dir: str | Path, run_name: str | None, prefix: str, notes: list[str], find: Callable | None = None
) -> Path | None:
    """What resume 'auto' continues, from the command line or TrainConfig alike: the run named `run_name` when it
    holds a last.pt, else (no name) the newest resumable <prefix>-<time> run (`find(output_dir)`, default
    find_resumable). None, with the line that says so in `notes`: nothing to resume, a new run starts."""
    root = Path(output_dir)
    if not run_name:
        found = (find or (lambda r: find_resumable(r, prefix, notes)))(root)
        if found is None:
            notes.append(f"resume auto: nothing to resume under {root} (no unfinished {prefix}-* run with a "
                         f"checkpoint); starting a new run")  # fmt: skip
        return found
    cand = root / run_name
    if (cand / "checkpoints" / "last.pt").is_file():
        refuse_if_live(cand)
        return cand
    try:  # a live run without a last.pt yet: this one starts in a directory of its own (claim_run_dir)
        refuse_if_live(cand, "it has no last.pt yet; this run starts in a directory of its own")
        notes.append(f"resume auto: nothing to resume under {cand}; starting a new run")
    except RunDirError as e:
        notes.append(f"resume auto: {e}")
    return None


def resolve_resume(cfg: TrainConfig, prefix: str, notes: list[str]) -> TrainConfig:
    """`cfg` with resume 'auto' replaced by the run it continues (resume_auto), or by None: a new run."""
    if cfg.resume != "auto":
        return cfg
    found = resume_auto(cfg.output_dir, cfg.run_name, prefix, notes)
    return dataclasses.replace(cfg, resume=str(found) if found else None)


def newest_readable(runs: list[Path], notes: list[str] | None = None) -> Path | None:
    """Of run directories, the one whose checkpoints/last.pt was written last and loads (digest checked)."""
    by_age = sorted(runs, key=lambda p: (p / "checkpoints/last.pt").stat().st_mtime, reverse=True)
    for run in by_age:
        try:
            load_checkpoint(run / "checkpoints" / "last.pt")
            return run
        except Exception as e:  # noqa: BLE001 (damaged, truncated, not ours: the next run is tried)
            if notes is not None:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                notes.append(f"resume auto: passed over {run}: its last.pt cannot be read ({first[:160]})")
    return None


def finished(run_dir: Path, step: int | None = None) -> bool:
    """The run trained to its end: summary.json was written at the end of training (not by a stop signal) at the
    step of its last checkpoint (`step`, else read from checkpoints/last.pt). Never file times: a copy that lost
    them is still finished, and a run extended (--resume with more --epochs) then killed has a later step."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(summary, dict) or "stopped_by" in summary or not isinstance(summary.get("steps"), int):
        return False
    if step is None:
        try:
            ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True, mmap=True)
            step = int(ckpt["step"])
        except Exception:  # missing or damaged: the resume itself reports it
            return False
    return step <= summary["steps"]


ROLLED_BACK = "metrics.rolled_back.jsonl"


def roll_back_metrics(run_dir: Path, step: int, junk: list[int], val_pending: bool = False) -> int:
    """Resuming from a checkpoint at `step`: rows a killed process wrote after it are trained again, so they move
    from metrics.jsonl to metrics.rolled_back.jsonl (kept, never deleted), as does a line torn by the kill. With
    `val_pending` (the checkpoint came right before a validation, which the resume runs again) a val row at `step`
    moves too. A line that is not a JSON row moves as it is; its line number goes to `junk`. Returns how many rows
    moved for being after `step`."""

    def after(row: dict[str, Any]) -> bool:
        s = row.get("step")
        return (isinstance(s, int) and s > step) or (val_pending and s == step and row.get("kind") == "val")

    return move_jsonl_rows(run_dir / "metrics.jsonl", run_dir / ROLLED_BACK, after, junk)


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
            torch.distributed.broadcast_object_list(box, src=0)
            run_dir = box[0]
    assert run_dir is not None
    return Path(run_dir), note


_ROW_JSON = json.JSONEncoder(default=str, allow_nan=False)  # json.dumps with these settings, built once


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
        held = _HELD.pop(str(run_dir.resolve()), None)  # the lock this process took when it claimed the directory
        self.lock = held or RunLock(
            run_dir, fix=WAIT_OR_RENAME
        )  # first: nothing is created in a directory another process trains
        self.notes: list[str] = [self.lock.note] if self.lock.note else []
        try:
            (run_dir / "checkpoints").mkdir(exist_ok=True)
            if (run_dir / "checkpoints").is_symlink():  # saves and the resume's pruning would act on the target
                raise RunDirError(
                    f"{run_dir / 'checkpoints'} is a symbolic link (to {os.readlink(run_dir / 'checkpoints')}): a run "
                    f"writes its checkpoints inside its own directory; make it a plain folder (--output_dir puts the "
                    f"whole run on another disk)"
                )
            if not (run_dir / MARKER).is_file():  # a run from before the marker, resumed: marked now, under its lock
                _mark(run_dir)
            self.removed = remove_orphan_temps(run_dir / "checkpoints") + remove_orphan_temps(run_dir)
            junk: list[int] = []
            self.rolled_back = (
                0 if resumed_step is None else roll_back_metrics(run_dir, resumed_step, junk, val_pending)
            )
            if junk:
                shown = ", ".join(map(str, junk[:5])) + (" ..." if len(junk) > 5 else "")
                self.notes.append(
                    f"{run_dir / 'metrics.jsonl'}: line(s) {shown} are not JSON rows (damaged); moved as they are to "
                    f"{ROLLED_BACK}, the other rows kept"
                )
            self._metrics = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        except BaseException:
            self.lock.release()
            raise

    def check(self, writing: str) -> None:
        """Stop (RunDirGone) when the run directory was removed or replaced: nothing is recreated silently."""
        self.lock.check(writing)

    def write_json(self, name: str, obj: Any) -> None:
        """Whole or not at all (temp file, fsync, rename), strict JSON (a non-finite number is null)."""
        self.check(name)
        text = json.dumps(strict_json(obj, []), indent=2, default=str, allow_nan=False)
        atomic_write_text(self.run_dir / name, text)

    def log(self, row: dict[str, Any]) -> None:
        row.setdefault("time", time.time())  # wall clock, so rows line up with other logs
        bad: list[str] = []
        clean = strict_json(row, bad)
        if bad:  # strict JSON has no NaN: null, and the row says which values were not finite
            clean["nonfinite"] = bad
        self.check("metrics.jsonl")  # an open file would go on taking rows after its directory was deleted
        try:
            self._metrics.write(_ROW_JSON.encode(clean) + "\n")
            self._metrics.flush()
        except OSError as e:
            raise storage_error(self.run_dir / "metrics.jsonl", e) from e
        if self.on_row is not None:
            self.on_row(row)

    def close(self) -> None:
        try:
            with contextlib.suppress(OSError):  # a full disk's last flush: the rows before are on disk, already raised
                self._metrics.close()
        finally:
            self.lock.release()
