"""Fault-injection campaign on the CLI (CPU): does any fault lose a run? tests/test_faults.py runs it with small N;
run here, at full size, it writes the table docs/guides/never-lose-a-run.md shows.

    .venv/bin/python -m tests.fault_campaign                              # the committed table (~10 min, 2 cores)
    .venv/bin/python -m tests.fault_campaign --kills 3 --signals 3 --no-elastic   # a quick look

Every case drives `train_optimized.py` (or `optimize_training.sh`) as a user would, in a subprocess, with tiny
settings (10 deg grid, d_model 32, 1 layer, a checkpoint every 2 steps), one thread per process:
  kill       kill -9 at a random moment of training (often while last.pt is being written), then
             `--resume RUN_DIR` alone; the final model and optimizer state must equal, bit for bit, those of
             an uninterrupted run, and no orphan temp file may be left behind
  signal     SIGTERM / SIGINT / SIGUSR1 / SIGHUP at a random moment: exit code 128 + signal, a resume command printed,
             last.pt verified; running the printed command must end bit-identical to the uninterrupted run;
             also Ctrl-C twice (exits at once; the run still resumes)
  nan        NaN in one input batch, NaN out of the forward at one step (both injected into the real model),
             NaN at every step (must stop with exit 3), and --lr 1000: non-finite steps are skipped and
             counted, no checkpoint ever holds a non-finite weight
  collision  a reused --run_name, two launches with one name at once, two default names at once, and a second
             live process on one run directory (refused by the lock, exit 2)
  bad input  bad data paths, damaged / pickled / missing checkpoints, bad flag values, bad launcher variables:
             exit 2 with a message of one or two lines and no traceback
  hostile    run names that leave the output directory, NaN / negative knobs, paths that are files, FIFOs or
             devices, a non-UTF-8 config, a zero-byte re-ID image, bad launcher variables: exit 2, one line naming
             it, no run directory and nothing written outside
  resume     config.toml emptied or deleted, a non-UTF-8 flag, a changed batch size or a step budget below the
             checkpoint on resume (refused, nothing changed), a finished run whose file times were lost (never
             re-scored); then `--resume RUN_DIR` alone must end bit-identical
  outside    a user's directory named as --run_name (never reused), --resume auto beside a live run (skipped)
  setup      a stop signal during set-up: exit 128 + N, one line, no traceback
  elastic    optimize_training.sh with NPROC_PER_NODE=2 MAX_RESTARTS=1 (torchrun, gloo): one worker killed
             mid-run, torchrun restarts both, they resume from last.pt; final weights must equal an
             uninterrupted two-process run's
"Runs lost" counts every case whose training could not be continued to the uninterrupted result, or whose files
another run overwrote: goal 0.
Writes benchmarks/results/faults_cpu.json and the table beside it (faults_cpu.md).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, write_result
from trainer.checkpoint import CheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d_model", "32", "--num_layers", "1", "--dim_feedforward", "64", "--resolution", "10", "--no-plots",
        "--no-progress_bar"]  # fmt: skip
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGUSR1": signal.SIGUSR1, "SIGHUP": signal.SIGHUP}
EXIT_BAD_INPUT, EXIT_NON_FINITE = 2, 3


def install_nan_injector(mode: str, steps: str) -> Callable[[], None]:
    """Patch the RecursiveAttentionTransformer's training forward to inject NaN; returns the undo function.

    mode: "input" (one input value NaN) or "output" (the prediction NaN); steps: "5" (the 5th training forward
    only) or "5-" (the 5th and every later one). The real model and loss see it, as real bad data would.
    """
    import models.ratransformer as m

    first = int(steps.rstrip("-"))
    every = steps.endswith("-")
    orig, calls = m.RecursiveAttentionTransformer.forward, [0]

    def forward(self: Any, x: torch.Tensor, *a: Any, **k: Any) -> Any:
        if not self.training:
            return orig(self, x, *a, **k)
        calls[0] += 1
        hit = calls[0] >= first if every else calls[0] == first
        if hit and mode == "input":
            x = x.clone()
            x.view(-1)[0] = float("nan")
        out = orig(self, x, *a, **k)
        return out * float("nan") if hit and mode == "output" else out

    m.RecursiveAttentionTransformer.forward = forward  # type: ignore[method-assign]

    def undo() -> None:
        m.RecursiveAttentionTransformer.forward = orig  # type: ignore[method-assign]

    return undo


# the CLI in a subprocess with the injector installed: argv MODE STEPS CLI-ARGS...
NAN_INJECTOR = (
    "import sys\n"
    "from tests.fault_campaign import install_nan_injector\n"
    "install_nan_injector(sys.argv[1], sys.argv[2])\n"
    "import train_optimized\n"
    "sys.exit(train_optimized.main(sys.argv[3:]))\n"
)

HOLD_S = 600.0  # a held run waits this long for the campaign at most, then goes on: a lost campaign never hangs it


def install_pause(where: str, n: int, marker: str) -> None:
    """Make this run stop at a chosen point, say so by writing `marker`, and wait there until `marker`.go exists
    (the campaign has signalled it) or it is killed. where: "step" (the n-th training forward of the
    RecursiveAttentionTransformer) or "write" (the n-th write of last.pt, half its bytes in the temp file). The
    campaign then acts on an event, not after a guessed delay: a loaded machine changes when, never what."""
    import trainer.support.checkpoint_file as ck

    flag, go, count = Path(marker), Path(marker + ".go"), [0]

    def hold() -> None:
        flag.write_text(str(os.getpid()), encoding="utf-8")
        t_end = time.monotonic() + HOLD_S
        while not go.exists() and time.monotonic() < t_end:
            time.sleep(0.01)  # a signal's handler runs here, in this (the main) thread

    if where == "step":
        import models.ratransformer as m

        orig = m.RecursiveAttentionTransformer.forward

        def forward(self: Any, *a: Any, **k: Any) -> Any:
            if self.training:
                count[0] += 1
                if count[0] == n:
                    hold()
            return orig(self, *a, **k)

        m.RecursiveAttentionTransformer.forward = forward  # type: ignore[method-assign]
        return
    real_write = ck.atomic_write

    def atomic_write(path: str | os.PathLike, write: Callable[[Any], object]) -> Path:
        if Path(path).name != "last.pt":
            return real_write(path, write)
        count[0] += 1
        if count[0] != n:
            return real_write(path, write)

        def half_then_hold(f: Any) -> None:
            buf = io.BytesIO()
            write(buf)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            hold()
            f.write(data[len(data) // 2 :])

        return real_write(path, half_then_hold)

    ck.atomic_write = atomic_write  # atomic_save looks it up in its module at each call


# the CLI in a subprocess that pauses as install_pause says: argv WHERE N MARKER CLI-ARGS...
PAUSE_INJECTOR = (
    "import sys\n"
    "from tests.fault_campaign import install_pause\n"
    "install_pause(sys.argv[1], int(sys.argv[2]), sys.argv[3])\n"
    "import train_optimized\n"
    "sys.argv = [train_optimized.__file__, *sys.argv[4:]]\n"
    "sys.exit(train_optimized.main(sys.argv[1:]))\n"
)


def handles_signal(pid: int, sig: int) -> bool | None:
    """Whether process `pid` has a handler for `sig` (Linux: /proc/PID/status SigCgt); None where unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Case:
    kind: str  # kill, signal, nan, collision, bad_input, elastic
    name: str
    ok: bool = False
    lost: bool = False  # the run could not be continued to the uninterrupted result, or was overwritten
    detail: str = ""
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Proc:
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def text(self) -> str:
        return self.out + self.err


def message_lines(err: str) -> list[str]:
    """stderr without argparse's usage block (a usage line and its indented continuation lines)."""
    lines, in_usage = [], False
    for ln in err.splitlines():
        if ln.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and ln.startswith(" "):
            continue
        in_usage = False
        if ln.strip():
            lines.append(ln)
    return lines


def same_tree(a: Any, b: Any) -> bool:
    """Bitwise equality of nested checkpoint entries (tensors compared as bytes, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def all_finite(tree: Any) -> bool:
    if isinstance(tree, torch.Tensor):
        return not tree.is_floating_point() or bool(torch.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(all_finite(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return all(all_finite(v) for v in tree)
    return True


def orphans(run_dir: Path) -> list[str]:
    return sorted(
        p.name
        for d in (run_dir, run_dir / "checkpoints")
        if d.is_dir()
        for p in d.iterdir()
        if p.name.startswith(".") and p.name.endswith(".tmp")
    )


class Campaign:
    """One work folder, one environment, one random generator; each method runs one case and records it."""

    def __init__(self, work: Path, epochs: int = 12, seed: int = 0, log: Callable[[str], Any] = print,
                 inprocess: bool = False, events: bool = False) -> None:  # fmt: skip
        """inprocess: run the cases whose outcome is not a bitwise comparison (NaN, a reused name, bad inputs,
        the refused second process) inside this process, which saves a Python start-up each (the tests).
        events: stop, signal or kill a run where it says it has reached a point drawn at random (a training step,
        a write of last.pt; install_pause) instead of after a random delay, so that the outcome never depends on
        how fast the machine is (the tests); the campaign's random delays also land in validation and set-up."""
        self.work = Path(work)
        self.inprocess = inprocess
        self.events = events
        self.out = self.work / "runs"
        self.out.mkdir(parents=True, exist_ok=True)
        self.epochs = epochs
        self.seed = seed
        self.log = log
        cache = os.environ.get("PLAINLOOP_CACHE") or str(self.work / "cache")
        env = {k: v for k, v in os.environ.items() if k not in ("PLAINLOOP_DEBUG", "RUN_NAME", "MAX_RESTARTS")}
        # one thread per process: bit-exact comparisons need the same kernels, and the machine is shared
        env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PLAINLOOP_CACHE": cache, "PYTHONPATH": str(ROOT),
                    "PYTHONUNBUFFERED": "1",
                    # the launcher's `python` (SKIP_SETUP=1) must be this interpreter
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})  # fmt: skip
        self.env = env
        self.cases: list[Case] = []
        self._refs: dict[str, tuple[dict[str, Any], float]] = {}
        self._ref_lock = threading.Lock()  # cases may run in threads (the tests): one reference run each

    def rng(self, name: str) -> random.Random:
        """A generator per case: its random moment depends on (seed, case name) only, not on case order."""
        return random.Random(f"{self.seed}:{name}")

    # ------------------------------------------------------------------------------------ running
    def train_args(self, name: str, *extra: str, epochs: int | None = None) -> list[str]:
        return ["--output_dir", str(self.out), "--run_name", name, "--epochs", str(epochs or self.epochs),
                "--checkpoint_every", "2", *TINY, *extra]  # fmt: skip

    def _logs(self, tag: str) -> tuple[Path, Path]:
        d = self.work / "logs"
        d.mkdir(exist_ok=True)
        return d / f"{tag}.out", d / f"{tag}.err"

    def start(self, argv: list[str], tag: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Any]:
        out, err = self._logs(tag)
        fo, fe = open(out, "w"), open(err, "w")  # noqa: SIM115 (closed in finish)
        p = subprocess.Popen(
            argv, cwd=ROOT, env={**self.env, **(env or {})}, stdout=fo, stderr=fe, start_new_session=True
        )  # its own group: a stray child never outlives a case
        return p, (fo, fe, out, err, time.monotonic())

    def finish(self, p: subprocess.Popen, handle: Any, timeout: float = 600) -> Proc:
        fo, fe, out, err, t0 = handle
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
        fo.close()
        fe.close()
        return Proc(rc, out.read_text(errors="replace"), err.read_text(errors="replace"), time.monotonic() - t0)

    def cli(self, *args: str, tag: str, env: dict[str, str] | None = None, timeout: float = 600,
            inproc_ok: bool = False) -> Proc:  # fmt: skip
        if inproc_ok and self.inprocess:
            return self._inprocess(list(args), tag)
        p, h = self.start([sys.executable, str(ROOT / "train_optimized.py"), *args], tag, env)
        return self.finish(p, h, timeout)

    def _inprocess(self, argv: list[str], tag: str) -> Proc:
        """train_optimized.main(argv) here, stdout/stderr captured; an exception is a traceback and exit 1."""
        import contextlib
        import io
        import traceback

        import train_optimized

        out, err = io.StringIO(), io.StringIO()
        saved = {k: os.environ.get(k) for k in ("PLAINLOOP_CACHE", "PLAINLOOP_DEBUG")}
        os.environ["PLAINLOOP_CACHE"] = self.env["PLAINLOOP_CACHE"]
        os.environ.pop("PLAINLOOP_DEBUG", None)
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = train_optimized.main(argv)
                    rc = 0 if rc is None else int(rc)
                except SystemExit as e:
                    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                    if isinstance(e.code, str):
                        err.write(e.code + "\n")
                except Exception:
                    err.write(traceback.format_exc())
                    rc = 1
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        res = Proc(rc, out.getvalue(), err.getvalue(), time.monotonic() - t0)
        fo, fe = self._logs(tag)
        fo.write_text(res.out)
        fe.write_text(res.err)
        return res

    def launcher(self, *args: str, tag: str, env: dict[str, str], timeout: float = 600) -> Proc:
        p, h = self.start(["bash", str(ROOT / "optimize_training.sh"), *args], tag, {"SKIP_SETUP": "1", **env})
        return self.finish(p, h, timeout)

    @staticmethod
    def wait_for(path: Path, p: subprocess.Popen, timeout: float = 600) -> float | None:
        """Poll until `path` exists (the time) or the process ended (None). The timeout only catches a hang."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if path.exists():
                return time.monotonic()
            if p.poll() is not None:
                return time.monotonic() if path.exists() else None
            time.sleep(0.01)
        return None

    def start_paused(self, name: str, where: str, n: int, args: list[str] | None = None
                     ) -> tuple[subprocess.Popen, Any, Path | None]:  # fmt: skip
        """Start `name`'s training run (CLI `args`, default train_args(name)) held at a point (install_pause) and
        wait until it is there. Returns the marker, or None when the run ended without reaching the point;
        `release(marker)` lets it go on."""
        events = self.work / "events"
        events.mkdir(exist_ok=True)
        marker = events / f"{name}.{where}{n}"
        argv = [sys.executable, "-c", PAUSE_INJECTOR, where, str(n), str(marker), *(args or self.train_args(name))]
        p, h = self.start(argv, name)
        return p, h, marker if self.wait_for(marker, p) is not None else None

    @staticmethod
    def release(marker: Path | None) -> None:
        if marker is not None:
            Path(f"{marker}.go").touch()

    def final_state(self, run_dir: Path) -> dict[str, Any]:
        ck = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        return {"model": ck["model"], "optimizer": ck["optimizer"], "step": ck.get("step")}

    def record(self, case: Case) -> Case:
        self.cases.append(case)
        flag = "ok " if case.ok else "FAIL"
        self.log(f"[faults] {flag} {case.kind:9s} {case.name:28s} {case.seconds:6.1f}s  {case.detail}")
        return case

    # ---------------------------------------------------------------------------------- reference
    def reference(self, key: str = "ref") -> tuple[dict[str, Any], float]:
        """An uninterrupted run's final state and its training window (config.json to the final last.pt)."""
        with self._ref_lock:
            return self._reference(key)

    def _reference(self, key: str) -> tuple[dict[str, Any], float]:
        if key not in self._refs:
            p, h = self.start([sys.executable, str(ROOT / "train_optimized.py"), *self.train_args(key)], key)
            self._record_reference(key, p, h, "reference run")
        return self._refs[key]

    def _record_reference(self, key: str, p: subprocess.Popen, h: Any, what: str) -> None:
        """Wait for the uninterrupted run `p` (run name `key`); keep its final state and training window."""
        run_dir = self.out / key
        t_start = self.wait_for(run_dir / "config.json", p)
        res = self.finish(p, h)
        if res.rc != 0 or t_start is None:
            raise RuntimeError(f"the uninterrupted {what} failed (exit {res.rc}):\n{res.text[-3000:]}")
        # the training part: config.json (written as training starts) to the final last.pt
        window = (run_dir / "checkpoints" / "last.pt").stat().st_mtime - (run_dir / "config.json").stat().st_mtime
        self._refs[key] = (self.final_state(run_dir), max(window, 0.2))

    def start_and_wait(self, name: str, delay: float | None, share: float) -> tuple[subprocess.Popen, Any, float]:
        """Start `name`'s training run and return `delay` seconds after training started (config.json written);
        delay None = drawn at random over the first `share` of the reference's training window."""
        _, window = self.reference()
        p, h = self.start([sys.executable, str(ROOT / "train_optimized.py"), *self.train_args(name)], name)
        started = self.wait_for(self.out / name / "config.json", p)
        if delay is None:
            delay = self.rng(name).uniform(0.0, share * window)
        if started is not None:
            time.sleep(max(0.0, started + delay - time.monotonic()))
        return p, h, delay

    def _drawn_step(self, name: str, share: float) -> int:
        """A training step drawn at random over the first `share` of the uninterrupted run's steps."""
        ref, _ = self.reference()
        return self.rng(name).randint(1, max(1, int(share * int(ref["step"]))))

    # --------------------------------------------------------------------------------- kill -9
    def kill_case(self, i: int, delay: float | None = None, mid_write: bool = False) -> Case:
        """delay: seconds after training starts (config.json written); None = drawn at random.
        mid_write: after the delay, wait for a checkpoint temp file to appear and kill while it is written."""
        ref, _ = self.reference()
        name = f"kill{i}"
        case = Case("kill", name)
        t0 = time.monotonic()
        run_dir = self.out / name
        if self.events:  # held in a write of last.pt (the 2nd to 6th: one exists), or at a training step
            where, n = ("write", self.rng(name).randint(2, 6)) if mid_write else ("step", self._drawn_step(name, 0.9))
            p, h, _ = self.start_paused(name, where, n)
            delay, when = 0.0, f"at {where} {n}"
            case.info[f"at_{where}"] = n
        else:
            p, h, delay = self.start_and_wait(name, delay, 0.9)
            when = f"{delay:.2f}s in"
            if mid_write:
                ckdir, t_end = run_dir / "checkpoints", time.monotonic() + 5.0
                while p.poll() is None and time.monotonic() < t_end and not list(ckdir.glob(".*.tmp")):
                    pass  # spin: a small checkpoint is written in milliseconds
        killed = p.poll() is None
        if killed:
            os.killpg(p.pid, signal.SIGKILL)
        first = self.finish(p, h)
        left = orphans(run_dir)
        case.info.update(delay_s=round(delay, 3), killed=killed, mid_write=bool(left), orphans_after_kill=left)
        if not killed:
            case.detail = f"finished before the kill (exit {first.rc}); not counted"
            case.seconds = time.monotonic() - t0
            case.info["counted"] = False
            return self.record(case)
        has_last = (run_dir / "checkpoints" / "last.pt").exists()
        if has_last:
            try:
                step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
                case.info["last_pt_step"] = step
            except CheckpointError as e:  # a kill must never leave an unreadable last.pt
                case.detail, case.lost = f"last.pt unreadable after the kill: {e}", True
                return self.record(case)
            # alone: settings from the run; killed after its last step (while validating or testing), the resume
            # finishes the evaluation and the summary
            case.info["after_training"] = step >= ref["step"]
            res = self.cli("--resume", str(run_dir), tag=f"{name}-resume")
        else:  # killed before the first checkpoint: start it again under its name
            res = self.cli(*self.train_args(name), "--resume", "auto", tag=f"{name}-restart")
        case.info["resume_rc"] = res.rc
        case.seconds = time.monotonic() - t0
        if res.rc != 0:
            case.detail, case.lost = (
                f"resume failed (exit {res.rc}): {res.text.strip().splitlines()[-1:]}",
                True,
            )
            return self.record(case)
        used = _run_dir_of(res.text) or run_dir
        moved = (
            "" if used == run_dir else f"; restarted in {used.name}, not {name}: a later `--resume auto` would miss it"
        )
        equal = same_tree(self.final_state(used), ref)
        tidy = not orphans(run_dir)
        case.ok, case.lost = equal and tidy and not moved, not equal
        case.detail = (
            f"killed {when}{' mid-write' if left else ''}, "
            f"{'resumed from step ' + str(case.info.get('last_pt_step')) if has_last else 'restarted'}: "
            f"{'bit-identical' if equal else 'DIFFERENT from the uninterrupted run'}"
            f"{'' if tidy else ', orphan temp files left: ' + ', '.join(orphans(run_dir))}{moved}"
        )
        return self.record(case)

    # --------------------------------------------------------------------------------- signals
    def signal_case(self, i: int, signame: str, twice: bool = False, delay: float | None = None) -> Case:
        """delay: seconds after training starts; None = drawn at random over the first 70 % of training."""
        ref, _ = self.reference()
        sig = SIGNALS[signame]
        name = f"sig{i}-{signame.lower()}{'-x2' if twice else ''}"
        case = Case("signal", name)
        t0 = time.monotonic()
        run_dir = self.out / name
        marker = None
        if self.events:  # held at a training step drawn over the first 70 % of training, signalled there
            n = self._drawn_step(name, 0.7)
            p, h, marker = self.start_paused(name, "step", n)
            delay, when = 0.0, f"at step {n}"
            case.info["at_step"] = n
        else:
            p, h, delay = self.start_and_wait(name, delay, 0.7)
            when = f"{delay:.2f}s in"
        sent = p.poll() is None
        t_sig = time.monotonic()
        if sent:
            p.send_signal(sig)
            if twice:
                time.sleep(0.05)  # the second press of Ctrl-C: whenever it lands, it must stop at once
                if p.poll() is None:
                    p.send_signal(sig)
        self.release(marker)
        first = self.finish(p, h)
        stop_s = time.monotonic() - t_sig
        case.info.update(delay_s=round(delay, 3), exit=first.rc, stop_s=round(stop_s, 3))
        if not sent:
            case.detail = f"finished before the signal (exit {first.rc}); not counted"
            case.info["counted"] = False
            case.seconds = time.monotonic() - t0
            return self.record(case)
        last = run_dir / "checkpoints" / "last.pt"
        ck_step = _step_of(last)
        if ck_step is not None and ck_step >= ref["step"] and first.rc != 128 + int(sig):
            # the signal came after training had ended (during the final evaluation): nothing to save or resume
            case.detail = f"arrived after training ended (exit {first.rc}); not counted"
            case.info.update(counted=False, after_training=True)
            case.seconds = time.monotonic() - t0
            return self.record(case)
        problems = []
        want = 128 + int(sig)
        if first.rc != want and not (twice and first.rc != 0):
            problems.append(f"exit {first.rc}, expected {want}")
        resume_cmd = None
        if not twice:
            lines = [ln for ln in first.text.splitlines() if "--resume" in ln and "train_optimized.py" in ln]
            if lines:
                resume_cmd = shlex.split(lines[-1][lines[-1].index("python") :] if "python" in lines[-1] else lines[-1])
            else:
                problems.append("no resume command printed")
        if last.exists():
            try:
                ck = load_checkpoint(last)
                case.info["last_pt_step"] = ck["step"]
                case.info["mid_epoch"] = bool(ck.get("batches_done"))
            except CheckpointError as e:
                problems.append(f"last.pt unreadable: {e}")
        elif not twice:
            problems.append("no last.pt written")
        if resume_cmd and Path(resume_cmd[0]).name.startswith("python"):
            resume_cmd[0] = sys.executable
        if resume_cmd is None or not last.exists():
            argv = ["--resume", str(run_dir)] if last.exists() else [*self.train_args(name), "--resume", "auto"]
            resume_cmd = [sys.executable, str(ROOT / "train_optimized.py"), *argv]
        elif resume_cmd[1:2] == ["train_optimized.py"]:
            resume_cmd[1] = str(ROOT / "train_optimized.py")
        # stopped at the very last step: the resume still scores the test split and writes the summary
        case.info["stopped_at_last_step"] = ck_step is not None and ck_step >= ref["step"]
        rp, rh = self.start(resume_cmd, f"{name}-resume")
        res = self.finish(rp, rh)
        case.info["resume_rc"] = res.rc
        case.info["resume_command"] = " ".join(shlex.quote(a) for a in resume_cmd)
        case.seconds = time.monotonic() - t0
        if res.rc != 0:
            case.lost = True
            problems.append(f"resume failed (exit {res.rc}): {res.text.strip().splitlines()[-1:]}")
            case.detail = "; ".join(problems)
            return self.record(case)
        equal = same_tree(self.final_state(run_dir), ref)
        if not equal:
            problems.append("DIFFERENT from the uninterrupted run")
        case.lost = not equal
        case.ok = not problems
        where = f"step {case.info.get('last_pt_step')}" + (" (mid-epoch)" if case.info.get("mid_epoch") else "")
        case.detail = (
            f"{signame}{' twice' if twice else ''} {when}: exit {first.rc} after "
            f"{stop_s:.2f}s, last.pt at {where}; resumed: {'bit-identical' if equal else 'different'}"
            + ("; " + "; ".join(problems) if problems else "")
        )
        return self.record(case)

    # ------------------------------------------------------------------------------------- NaN
    def nan_case(self, mode: str) -> Case:
        """mode: input (one NaN input value at step 5), output (NaN prediction at step 5), always (NaN
        prediction from step 5 on: must stop with exit 3), lr1000 (--lr 1000)."""
        name = f"nan-{mode}"
        case = Case("nan", name)
        run_dir = self.out / name
        args = self.train_args(name, epochs=4)
        if mode == "lr1000":
            res = self.cli(*args, "--lr", "1000", tag=name, inproc_ok=True)
        else:
            inj = {"input": ("input", "5"), "output": ("output", "5"), "always": ("output", "5-")}[mode]
            extra = ["--max_consecutive_skips", "5"] if mode == "always" else []
            if self.inprocess:
                undo = install_nan_injector(*inj)
                try:
                    res = self._inprocess([*args, *extra], name)
                finally:
                    undo()
            else:
                p, h = self.start([sys.executable, "-c", NAN_INJECTOR, *inj, *args, *extra], name)
                res = self.finish(p, h)
        case.seconds = res.seconds
        problems = []
        summary_path = run_dir / "summary.json"
        summary = _read_json(summary_path)
        skipped = summary.get("skipped_steps") if summary else _last_skipped(run_dir)
        case.info.update(exit=res.rc, skipped_steps=skipped)
        if "Traceback" in res.text:
            problems.append("traceback printed")
        for ck in ("last.pt", "best.pt"):
            f = run_dir / "checkpoints" / ck
            if f.exists() and not all_finite(load_checkpoint(f)["model"]):
                problems.append(f"{ck} holds non-finite weights")
        if mode in ("input", "output"):
            if res.rc != 0:
                problems.append(f"exit {res.rc}, expected 0 (one bad step is skipped)")
            if skipped != 1:
                problems.append(f"skipped_steps {skipped}, expected 1")
        elif mode == "always":
            if res.rc != EXIT_NON_FINITE:
                problems.append(f"exit {res.rc}, expected {EXIT_NON_FINITE}")
            if not re.search(r"non-?finite|nan", res.text, re.I):
                problems.append("no message about non-finite values")
        else:  # lr 1000: either stopped (exit 3) or survived with skipped steps; never NaN weights, exit 0 + NaN
            if res.rc == EXIT_NON_FINITE:
                pass
            elif res.rc == 0:
                if not skipped:
                    case.info["note"] = "no non-finite step occurred"
            else:
                problems.append(f"exit {res.rc}, expected 0 or {EXIT_NON_FINITE}")
        case.ok = not problems
        case.detail = f"exit {res.rc}, skipped_steps {skipped}" + ("; " + "; ".join(problems) if problems else "")
        return self.record(case)

    # ------------------------------------------------------------------------------- collisions
    def collision_reuse_name(self) -> Case:
        """A finished run's name used again without --resume: a new directory, the old files untouched."""
        case = Case("collision", "reused --run_name")
        t0 = time.monotonic()
        args = self.train_args("reuse", "--max_steps", "4")
        first = self.cli(*args, tag="reuse-1", inproc_ok=True)
        before = _snapshot(self.out / "reuse")
        second = self.cli(*args, tag="reuse-2", inproc_ok=True)
        after = _snapshot(self.out / "reuse")
        case.seconds = time.monotonic() - t0
        new_dir = self.out / "reuse-2"
        problems = []
        if first.rc or second.rc:
            problems.append(f"exits {first.rc}, {second.rc}")
        if before != after:
            problems.append("the first run's files changed")
            case.lost = True
        if not (new_dir / "summary.json").exists():
            problems.append("no reuse-2 directory with a summary")
        elif "reuse-2" not in second.text:
            problems.append("the new directory is not mentioned")
        case.ok = not problems
        case.detail = "second run went to reuse-2, first run untouched" if case.ok else "; ".join(problems)
        return self.record(case)

    def collision_simultaneous(self, same_name: bool) -> Case:
        """Two launches at once, with one --run_name or both with the default name: two directories."""
        label = "two at once, one --run_name" if same_name else "two at once, default names"
        case = Case("collision", label)
        t0 = time.monotonic()
        sub = self.out / ("same" if same_name else "default")
        common = ["--output_dir", str(sub), "--max_steps", "4", "--checkpoint_every", "2", *TINY]
        if same_name:
            common += ["--run_name", "same"]
        procs = [
            self.start([sys.executable, str(ROOT / "train_optimized.py"), *common], f"{sub.name}-{k}") for k in range(2)
        ]
        res = [self.finish(p, h) for p, h in procs]
        case.seconds = time.monotonic() - t0
        dirs = sorted(d.name for d in sub.iterdir() if d.is_dir()) if sub.is_dir() else []
        problems = []
        if any(r.rc for r in res):
            problems.append(f"exits {[r.rc for r in res]}")
        if len(dirs) != 2:
            problems.append(f"directories {dirs}, expected two")
            case.lost = True
        for d in dirs:
            steps = [r["step"] for r in _rows(sub / d / "metrics.jsonl") if r.get("kind") == "train"]
            if steps != sorted(set(steps)):
                problems.append(f"{d}/metrics.jsonl has interleaved rows")
                case.lost = True
        case.ok = not problems
        case.detail = f"directories {dirs}" + ("; " + "; ".join(problems) if problems else "")
        return self.record(case)

    def collision_lock(self) -> Case:
        """A second live process on a running run's directory (--resume RUN_DIR) fails with exit 2."""
        case = Case("collision", "second process, same directory")
        t0 = time.monotonic()
        run_dir = self.out / "locked"
        problems = []
        marker = None
        if self.events:  # held at step 3, after its first last.pt (step 2), until the second start is refused
            p, h, marker = self.start_paused("locked", "step", 3, self.train_args("locked", epochs=self.epochs * 4))
            if marker is None:
                problems.append("the first run ended before its first checkpoint")
        else:
            argv = [
                sys.executable,
                str(ROOT / "train_optimized.py"),
                *self.train_args("locked", epochs=max(self.epochs * 4, 40)),
            ]
            p, h = self.start(argv, "locked")
            if self.wait_for(run_dir / "checkpoints" / "last.pt", p) is None:  # resumable, and running
                problems.append("the first run ended before its first checkpoint")
        second = self.cli("--resume", str(run_dir), tag="locked-2", inproc_ok=True)
        still_running = p.poll() is None
        if still_running:
            p.send_signal(signal.SIGTERM)
        self.release(marker)
        first = self.finish(p, h)
        case.seconds = time.monotonic() - t0
        msg = message_lines(second.err)
        case.info.update(second_exit=second.rc, message=msg, first_exit=first.rc)
        if not still_running:
            problems.append("the first run finished before the second start was refused; not a real test")
        if second.rc != EXIT_BAD_INPUT:
            problems.append(f"second process exit {second.rc}, expected {EXIT_BAD_INPUT}")
            case.lost = second.rc == 0
        if "Traceback" in second.text or not 1 <= len(msg) <= 2:
            problems.append(f"message of {len(msg)} lines")
        if not re.search(r"another (live )?process|lock", " ".join(msg)):
            problems.append(f"refused for another reason: {' '.join(msg)[:160]}")
        if first.rc not in (0, 128 + signal.SIGTERM):
            problems.append(f"first run exit {first.rc}")
        case.ok = not problems
        case.detail = f"refused: {msg[0][:120] if msg else ''}" if case.ok else "; ".join(problems)
        return self.record(case)

    # ------------------------------------------------------------------------------- bad inputs
    def bad_inputs(self) -> list[Case]:
        """Each must end with exit 2 and one or two lines naming the file/flag/variable; no traceback."""
        bad = self.work / "bad"
        bad.mkdir(exist_ok=True)
        (bad / "random.nc").write_bytes(random.Random(1).randbytes(4096))
        (bad / "random.pt").write_bytes(random.Random(2).randbytes(4096))
        evil = bad / "evil.pt"
        torch.save({"model": {}, "payload": _Payload(str(bad / "pwned"))}, evil)
        # a real checkpoint with one flipped bit in a weight
        ref_dir = self.out / "ref"
        flipped = bad / "flipped" / "checkpoints" / "last.pt"
        flipped.parent.mkdir(parents=True, exist_ok=True)
        if (ref_dir / "checkpoints" / "last.pt").exists():
            data = bytearray((ref_dir / "checkpoints" / "last.pt").read_bytes())
            data[len(data) // 2] ^= 0x10
            flipped.write_bytes(bytes(data))
        cases = [
            ("--data_path missing file", ["--data_path", str(bad / "nowhere.nc")], "nowhere.nc"),
            ("--data_path random bytes", ["--data_path", str(bad / "random.nc")], "random.nc"),
            ("--resume missing", ["--resume", str(bad / "no-such-run")], "no-such-run"),
            ("--resume random bytes", ["--resume", str(bad / "random.pt")], "random.pt"),
            ("--resume pickle payload", ["--resume", str(evil)], "evil.pt"),
            ("--resume flipped bit", ["--resume", str(bad / "flipped")], "last.pt"),
            ("--batch_size 0", ["--batch_size", "0"], "--batch_size"),
            ("--precision fp8", ["--precision", "fp8"], "--precision"),
            ("--lat 10 -10", ["--lat", "10", "-10"], "--lat"),
        ]
        out: list[Case] = []
        for label, args, names in cases:
            if label == "--resume flipped bit" and not flipped.exists():
                continue
            res = self.cli(*args, "--output_dir", str(bad / "runs"), *TINY, tag=f"bad-{len(out)}", inproc_ok=True)
            out.append(self._judge_bad(label, res, names))
            if (bad / "pwned").exists():
                out[-1].ok = False
                out[-1].detail += "; THE PICKLE PAYLOAD RAN"
        for var, value in (
            ("NPROC_PER_NODE", "two"),
            ("COMPILE", "maybe"),
            ("MAX_RESTARTS", "-1"),
            ("MASTER_PORT", "70000"),
        ):
            res = self.launcher(tag=f"bad-{var}", env={var: value, "PLAINLOOP_DRY_RUN": "0"})
            out.append(self._judge_bad(f"{var}={value}", res, var))
        return out

    def _judge_bad(self, label: str, res: Proc, names: str, kind: str = "bad_input") -> Case:
        case = Case(kind, label, seconds=res.seconds)
        msg = message_lines(res.err)
        case.info.update(exit=res.rc, message=msg)
        problems = []
        if res.rc != EXIT_BAD_INPUT:
            problems.append(f"exit {res.rc}, expected {EXIT_BAD_INPUT}")
        if "Traceback" in res.text:
            problems.append("traceback")
        if not 1 <= len(msg) <= 2:
            problems.append(f"{len(msg)} message lines")
        if names not in " ".join(msg):
            problems.append(f"message does not name {names}")
        case.ok = not problems
        case.detail = (msg[0][:160] if msg else "") + ("; " + "; ".join(problems) if problems else "")
        return self.record(case)

    def hostile_inputs(self) -> list[Case]:
        """Values that used to train wrong, write outside the output directory or end in a traceback: each must
        be exit 2 with one line naming the flag, file or variable, before any run directory exists."""
        bad = self.work / "hostile"
        bad.mkdir(exist_ok=True)
        (bad / "a_file").write_text("x", encoding="utf-8")
        (bad / "latin1.toml").write_bytes(b"[train]\nrun_name = '\xe9t\xe9'\n")
        fifo = bad / "fifo.nc"
        if not fifo.exists():
            os.mkfifo(fifo)
        market = bad / "market"
        _tiny_market(market)
        (market / "query" / "0003_c1s1_000009_00.jpg").write_bytes(b"")  # a zero-byte image among the queries
        runs = bad / "runs"
        cases = [
            ("--run_name ../../escape", ["--run_name", "../../escape"], "--run_name"),
            ("--run_name absolute", ["--run_name", str(bad / "abs")], "--run_name"),
            ("--run_name .", ["--run_name", "."], "--run_name"),
            ("--run_name too long", ["--run_name", "x" * 300], "--run_name"),
            ("--min_lr_ratio -3", ["--min_lr_ratio", "-3"], "--min_lr_ratio"),
            ("--weight_decay nan", ["--weight_decay", "nan"], "--weight_decay"),
            ("--warmup_steps -5", ["--warmup_steps", "-5"], "--warmup_steps"),
            ("--seed -1", ["--seed", "-1"], "--seed"),
            ("--resolution nan", ["--resolution", "nan"], "--resolution"),
            ("--device bogus", ["--device", "bogus"], "--device"),
            ("--output_dir a file", ["--output_dir", str(bad / "a_file")], "--output_dir"),
            ("--output_dir under a file", ["--output_dir", str(bad / "a_file" / "sub")], "--output_dir"),
            ("--cache_dir under a file", ["--cache_dir", str(bad / "a_file" / "c")], "--cache_dir"),
            ("--data_path FIFO", ["--data_path", str(fifo)], "--data_path"),
            ("--data_path /dev/zero", ["--data_path", "/dev/zero"], "--data_path"),
            ("--config directory", ["--config", str(bad)], "is a directory"),
            ("--config non-UTF-8", ["--config", str(bad / "latin1.toml")], "latin1.toml"),
            ("re-ID --margin nan", ["--task", "reid", "--margin", "nan"], "--margin"),
            ("re-ID --image_size 0 0", ["--task", "reid", "--image_size", "0", "0"], "--image_size"),
            ("re-ID --eval_workers -2", ["--task", "reid", "--eval_workers", "-2"], "--eval_workers"),
            ("re-ID zero-byte query image",
             ["--task", "reid", "--data_path", str(market), "--reid_format", "market1501"], "0003_c1s1_000009_00.jpg"),
        ]  # fmt: skip
        out: list[Case] = []
        for label, args, names in cases:
            extra = [] if "--output_dir" in args else ["--output_dir", str(runs)]
            tiny = TINY if "reid" not in args else ["--no-plots", "--no-progress_bar"]  # TINY is ERA5's model
            res = self.cli(*args, *extra, *tiny, tag=f"hostile-{len(out)}", inproc_ok=True)
            case = self._judge_bad(label, res, names, kind="hostile")
            made = sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []
            outside = sorted(p.name for p in bad.iterdir() if p.name not in ("a_file", "latin1.toml", "fifo.nc",
                                                                             "market", "runs"))  # fmt: skip
            if made or outside:
                case.ok, case.lost = False, bool(outside)
                case.detail += f"; written: {made + outside}"
            out.append(case)
        for var, value in (("RUN_NAME", "--help"), ("RUN_NAME", "../x"), ("TASK", "mnist"), ("PRECISION", "fp8")):
            res = self.launcher(tag=f"hostile-{var}", env={var: value, "PLAINLOOP_DRY_RUN": "0"})
            out.append(self._judge_bad(f"{var}={value}", res, var, kind="hostile"))
        return out

    # --------------------------------------------------------------------- resume never depends on one file
    def stopped_run(self, name: str) -> tuple[Path, Proc | None]:
        """A run stopped by SIGTERM right after its first checkpoint: the start of every resume case."""
        if self.events:  # held at step 3, after its first last.pt (step 2): stopped there
            p, h, marker = self.start_paused(name, "step", 3)
            if marker is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
            self.release(marker)
        else:
            p, h = self.start([sys.executable, str(ROOT / "train_optimized.py"), *self.train_args(name)], name)
            if self.wait_for(self.out / name / "checkpoints" / "last.pt", p) is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        res = self.finish(p, h)
        return self.out / name, res if res.rc == 128 + signal.SIGTERM else None

    def resume_case(self, what: str) -> Case:
        """what: config_empty, config_missing, bad_flag (a non-UTF-8 value on resume), batch_size (changed on a
        mid-run checkpoint), max_steps (below the checkpoint's step) or finished (a finished run whose file times
        were lost). Each ends with `--resume RUN_DIR` alone, which must continue to the uninterrupted result."""
        ref, _ = self.reference()
        name = f"resume-{what.replace('_', '-')}"
        case = Case("resume", name)
        t0 = time.monotonic()
        problems: list[str] = []
        if what == "finished":
            run_dir = self.out / name
            first = self.cli(*self.train_args(name), tag=name)
            if first.rc != 0:
                case.detail = f"the run failed (exit {first.rc}); not counted"
                case.info["counted"] = False
                return self.record(case)
            summary = (run_dir / "summary.json").read_bytes()
            later = time.time() + 60
            os.utime(run_dir / "checkpoints" / "last.pt", (later, later))  # a copy that did not keep file times
            res = self.cli("--resume", str(run_dir), tag=f"{name}-resume")
            case.info.update(exit=res.rc, message=message_lines(res.text)[-2:])
            if (run_dir / "summary.json").read_bytes() != summary:
                problems.append("summary.json rewritten (the run was scored again)")
                case.lost = True
            if res.rc not in (0, EXIT_BAD_INPUT) or "Traceback" in res.text:
                problems.append(f"exit {res.rc}")
            if not re.search(
                r"nothing (is )?left to (train|do)|already finished|the run (finished|stopped early) at", res.text
            ):
                problems.append("no line saying the run had finished")
            case.ok, case.seconds = not problems, time.monotonic() - t0
            case.detail = "recognised as finished from its checkpoint; summary untouched" if case.ok else "; ".join(
                problems)  # fmt: skip
            return self.record(case)
        run_dir, stopped = self.stopped_run(name)
        if stopped is None:
            case.detail = "the run ended before the stop; not counted"
            case.info["counted"] = False
            return self.record(case)
        before = _snapshot(run_dir)
        config = run_dir / "config.toml"
        if what == "config_empty":
            config.write_bytes(b"")
        elif what == "config_missing":
            config.unlink()
        elif what in ("bad_flag", "batch_size", "max_steps"):
            flag = {"bad_flag": ["--currency", "\udcff"], "batch_size": ["--batch_size", "16"],
                    "max_steps": ["--max_steps", "1"]}[what]  # fmt: skip
            res = self.cli("--resume", str(run_dir), *flag, tag=f"{name}-changed")
            msg = message_lines(res.err)
            case.info.update(changed_exit=res.rc, message=msg)
            if res.rc != EXIT_BAD_INPUT or "Traceback" in res.text or not 1 <= len(msg) <= 2:
                problems.append(f"{' '.join(flag)}: exit {res.rc}, {len(msg)} message lines (expected a refusal)")
            if flag[0] not in " ".join(msg):
                problems.append(f"the refusal does not name {flag[0]}")
            after = _snapshot(run_dir)
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and k != ".lock")
            if changed:
                problems.append(f"files changed by the refused resume: {changed}")
        res = self.cli("--resume", str(run_dir), tag=f"{name}-resume")
        case.info["resume_rc"] = res.rc
        equal = res.rc == 0 and same_tree(self.final_state(run_dir), ref)
        if not equal:
            problems.append(f"resume alone: exit {res.rc}, {'different' if res.rc == 0 else 'failed'}: "
                            f"{message_lines(res.err)[-1:]}")  # fmt: skip
            case.lost = True
        case.ok, case.seconds = not problems, time.monotonic() - t0
        case.detail = "then --resume RUN_DIR alone: bit-identical" if case.ok else "; ".join(problems)
        return self.record(case)

    # ------------------------------------------------------------------------- nothing outside the run
    def user_directory_case(self) -> Case:
        """--run_name naming a directory of the user's (no checkpoint, not a run): never reused or written."""
        case = Case("outside", "user's directory as --run_name")
        t0 = time.monotonic()
        mine = self.out / "mine"
        mine.mkdir(exist_ok=True)
        (mine / "config.json").write_text('{"mine": true}', encoding="utf-8")
        before = _snapshot(mine)
        res = self.cli(*self.train_args("mine", "--max_steps", "2"), tag="mine", inproc_ok=True)
        case.seconds = time.monotonic() - t0
        problems = []
        if _snapshot(mine) != before:
            problems.append("the user's directory was written")
            case.lost = True
        used = _run_dir_of(res.text)
        if res.rc != 0 or used is None or used == mine:
            problems.append(f"exit {res.rc}, run directory {used}")
        case.ok = not problems
        case.detail = f"trained in {used.name if used else '?'}, the user's files untouched" if case.ok else "; ".join(
            problems)  # fmt: skip
        return self.record(case)

    def resume_auto_live_case(self) -> Case:
        """--resume auto while another live process trains the newest resumable run: that run is skipped."""
        case = Case("outside", "--resume auto beside a live run")
        t0 = time.monotonic()
        sub = self.out / "auto-live"
        args = ["--output_dir", str(sub), "--checkpoint_every", "2", *TINY]
        live = [*args, "--run_name", "era5-live", "--epochs", str(self.epochs * 4)]
        problems = []
        marker = None
        if self.events:  # held at step 3, after its first last.pt (step 2), until the second start is done
            p, h, marker = self.start_paused("auto-live", "step", 3, live)
            if marker is None:
                problems.append("the live run ended before its first checkpoint")
        else:
            p, h = self.start([sys.executable, str(ROOT / "train_optimized.py"), *live], "auto-live")
            if self.wait_for(sub / "era5-live" / "checkpoints" / "last.pt", p) is None:
                problems.append("the live run ended before its first checkpoint")
        res = self.cli(*args, "--resume", "auto", "--max_steps", "2", tag="auto-live-2", inproc_ok=True)
        alive = p.poll() is None
        if alive:
            p.send_signal(signal.SIGTERM)
        self.release(marker)
        first = self.finish(p, h)
        case.seconds = time.monotonic() - t0
        used = _run_dir_of(res.text)
        if not alive:
            problems.append("the live run ended before the second start; not a real test")
        if res.rc != 0 or used is None or used.name == "era5-live":
            problems.append(f"second start: exit {res.rc}, run directory {used}")
            case.lost = used is not None and used.name == "era5-live"
        if first.rc not in (0, 128 + signal.SIGTERM):
            problems.append(f"the live run: exit {first.rc}")
        case.ok = not problems
        case.detail = f"skipped the live run, started {used.name if used else '?'}" if case.ok else "; ".join(problems)
        return self.record(case)

    # ------------------------------------------------------------------------------ signal in set-up
    def setup_signal_case(self, signame: str, delay: float) -> Case:
        """A stop signal `delay` s after the process handles it (the first lines of train_optimized.py), before
        training (imports, data, model): one line, exit 128+N. Before that point no program could answer it:
        a loaded machine can take seconds to get there, so the campaign waits for the handler, never a delay."""
        sig = SIGNALS[signame]
        name = f"setup-{signame.lower()}"
        case = Case("setup_signal", name)
        t0 = time.monotonic()
        p, h = self.start([sys.executable, str(ROOT / "train_optimized.py"), *self.train_args(name)], name)
        t_end = time.monotonic() + 600  # only a hang gets this far
        # SIGTERM's handler: Python has one for SIGINT from its own start, train_optimized.py sets all four at once
        while p.poll() is None and time.monotonic() < t_end and handles_signal(p.pid, signal.SIGTERM) is False:
            time.sleep(0.01)
        if handles_signal(p.pid, signal.SIGTERM) is None and p.poll() is None:  # no /proc: the first line it prints
            while p.poll() is None and time.monotonic() < t_end and not h[2].stat().st_size:
                time.sleep(0.01)
        time.sleep(delay)  # where in set-up it lands: any point is a set-up case
        started = (self.out / name / "config.json").exists()
        ended_first = p.poll() is not None  # a fast machine: the whole run ended before the signal was due
        if not ended_first:
            p.send_signal(sig)
        res = self.finish(p, h)
        case.seconds = time.monotonic() - t0
        case.info.update(exit=res.rc, delay_s=delay, training_started=started, message=message_lines(res.err))
        if ended_first:  # no signal was sent: not a set-up case, and not counted as one
            case.info["counted"] = False
            case.ok, case.detail = res.rc == 0, f"the run ended (exit {res.rc}) before the signal was due; not counted"
            return self.record(case)
        problems = []
        if res.rc != 128 + int(sig):
            problems.append(f"exit {res.rc}, expected {128 + int(sig)}")
        if "Traceback" in res.text:
            problems.append("traceback")
        if not started and len(message_lines(res.err)) != 1:
            problems.append(f"{len(message_lines(res.err))} message lines")
        case.ok = not problems
        case.detail = (message_lines(res.err)[-1][:120] if res.err.strip() else "") + (
            "; " + "; ".join(problems) if problems else "")  # fmt: skip
        return self.record(case)

    # ---------------------------------------------------------------------------------- elastic
    def elastic_case(self, i: int = 0, extra_args: tuple[str, ...] = ()) -> Case:
        """Two torchrun workers (gloo); rank 1 killed mid-run; MAX_RESTARTS=1 restarts and resumes them.
        extra_args: more CLI flags for both the reference and the restarted run."""
        import psutil

        case = Case("elastic", f"torchrun x2, rank 1 killed #{i}")
        t0 = time.monotonic()
        base = {"NPROC_PER_NODE": "2", "OUTPUT_DIR": str(self.out), "EPOCHS": str(self.epochs)}
        extra = ["--checkpoint_every", "2", *TINY, *extra_args]
        if "elastic-ref" not in self._refs:
            env = {"SKIP_SETUP": "1", **base, "RUN_NAME": "elastic-ref"}
            p, h = self.start(["bash", str(ROOT / "optimize_training.sh"), *extra], "elastic-ref", env)
            self._record_reference("elastic-ref", p, h, "two-process run")
        ref, window = self._refs["elastic-ref"]
        name = f"elastic{i}"
        run_dir = self.out / name
        env = {"SKIP_SETUP": "1", **base, "RUN_NAME": name, "MAX_RESTARTS": "1"}
        p, h = self.start(["bash", str(ROOT / "optimize_training.sh"), *extra], name, env)
        problems = []
        first_ckpt = self.wait_for(run_dir / "checkpoints" / "last.pt", p)
        victim = None
        if first_ckpt is not None:
            # the tests kill at the first checkpoint (an event); the campaign at a random moment after it
            delay = 0.0 if self.events else self.rng(name).uniform(0.0, 0.6 * window)
            time.sleep(delay)
            case.info["delay_after_first_checkpoint_s"] = round(delay, 3)
            for child in psutil.Process(p.pid).children(recursive=True):
                try:
                    if child.environ().get("RANK") == "1" and "train_optimized.py" in " ".join(child.cmdline()):
                        victim = child
                        break
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        if victim is not None and p.poll() is None:
            victim.send_signal(signal.SIGKILL)
            case.info["killed_pid"] = victim.pid
        else:
            problems.append("no worker killed (the run ended first or rank 1 was not found); not counted")
            case.info["counted"] = False
        res = self.finish(p, h)
        case.seconds = time.monotonic() - t0
        case.info["exit"] = res.rc
        # the restarted workers say where they resumed ("[plainloop] resume: RUN_DIR at step S (epoch ...)")
        resumed = re.findall(r"resume: \S+ at step (\d+)", res.text)
        restarted = bool(resumed)
        case.info["resumed_at_step"] = int(resumed[0]) if resumed else None
        if res.rc != 0:
            problems.append(f"exit {res.rc}")
            case.lost = victim is not None
        elif victim is not None:
            equal = same_tree(self.final_state(run_dir), ref)
            if not equal:
                problems.append("DIFFERENT from the uninterrupted two-process run")
                case.lost = True
            if not restarted:
                problems.append("no resumed worker seen in the log")
        case.ok = not problems
        case.detail = (
            "worker killed, torchrun restarted, resumed: bit-identical to the uninterrupted run"
            if case.ok
            else "; ".join(problems)
        )
        return self.record(case)

    # ---------------------------------------------------------------------------------- summary
    def summary(self) -> dict[str, Any]:
        def counted(kind: str) -> list[Case]:
            return [c for c in self.cases if c.kind == kind and c.info.get("counted", True)]

        kills, sigs = counted("kill"), counted("signal")
        out = {
            "kills": {
                "tried": len(kills),
                "survived": sum(c.ok for c in kills),
                "mid_write": sum(bool(c.info.get("mid_write")) for c in kills),
                "not_counted": sum(1 for c in self.cases if c.kind == "kill") - len(kills),
            },
            "signals": {
                "tried": len(sigs),
                "survived": sum(c.ok for c in sigs),
                "by_signal": {s: sum(c.ok for c in sigs if s.lower() in c.name) for s in SIGNALS},
            },
            "nan": {"tried": len(counted("nan")), "caught": sum(c.ok for c in counted("nan"))},
            "collisions": {"tried": len(counted("collision")), "ok": sum(c.ok for c in counted("collision"))},
            "bad_inputs": {
                "tried": len(counted("bad_input")),
                "clear": sum(c.ok for c in counted("bad_input")),
            },
            "elastic": {"tried": len(counted("elastic")), "survived": sum(c.ok for c in counted("elastic"))},
            "hostile": {"tried": len(counted("hostile")), "clear": sum(c.ok for c in counted("hostile"))},
            "resume": {"tried": len(counted("resume")), "survived": sum(c.ok for c in counted("resume"))},
            "outside": {"tried": len(counted("outside")), "ok": sum(c.ok for c in counted("outside"))},
            "setup_signal": {
                "tried": len(counted("setup_signal")),
                "clean": sum(c.ok for c in counted("setup_signal")),
            },
            "runs_lost": sum(c.lost for c in self.cases),
            "failures": [
                f"{c.kind}: {c.name}: {c.detail}" for c in self.cases if not c.ok and c.info.get("counted", True)
            ],
        }
        return out


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def _tiny_market(root: Path) -> None:
    """A Market-1501-shaped folder of tiny images: enough identities for a P x K batch."""
    from PIL import Image

    names = {
        "bounding_box_train": [f"{pid:04d}_c{c}s1_00000{k}_01.jpg" for pid in range(1, 9) for c in (1, 2) for k in (1, 2)],
        "query": ["0020_c1s1_000001_00.jpg"],
        "bounding_box_test": ["0020_c2s1_000002_00.jpg", "0021_c2s1_000003_00.jpg"],
    }  # fmt: skip
    for folder, files in names.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for n in files:
            Image.new("RGB", (8, 16), (200, 30, 30)).save(root / folder / n)


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rows(path: Path) -> list[dict[str, Any]]:
    import json

    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _last_skipped(run_dir: Path) -> int | None:
    vals = [r["skipped_steps"] for r in _rows(run_dir / "metrics.jsonl") if "skipped_steps" in r]
    return vals[-1] if vals else None


def _run_dir_of(text: str) -> Path | None:
    """The run directory a CLI run reported ("[plainloop] run directory: DIR ...")."""
    found = re.findall(r"run directory: (\S+)", text)
    return Path(found[-1]) if found else None


def _step_of(path: Path) -> int | None:
    try:
        return int(load_checkpoint(path)["step"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- main


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    cfg = result["config"]
    by_sig = ", ".join(f"{k} {v}" for k, v in s["signals"]["by_signal"].items())

    def row(fault: str, group: str, outcome: str, kind: str | None) -> list[Any]:
        lost = sum(c["lost"] for c in result["cases"] if c["kind"] == kind) if kind else 0
        return [fault, s[group]["tried"], outcome, lost]

    rows = [
        row("kill -9 at a random moment, then `--resume RUN_DIR` alone", "kills",
            f"{s['kills']['survived']} bit-identical ({s['kills']['mid_write']} mid-write)", "kill"),
        row("SIGTERM / SIGINT / SIGUSR1 / SIGHUP (and Ctrl-C twice), then the printed resume command", "signals",
            f"{s['signals']['survived']} bit-identical ({by_sig})", "signal"),
        row("NaN input, NaN forward, NaN every step, `--lr 1000`", "nan", f"{s['nan']['caught']} caught", "nan"),
        row("run-name collisions and a second live process", "collisions", f"{s['collisions']['ok']} kept apart",
            "collision"),
        # bad inputs are rejected before training starts: no run to lose
        row("bad inputs (data, checkpoints, flags, launcher variables)", "bad_inputs",
            f"{s['bad_inputs']['clear']} exit 2 with a 1-2 line message", None),
        row("hostile values: run names outside the output dir, NaN/negative knobs, paths that are files, FIFOs, "
            "devices, non-UTF-8 config, a zero-byte re-ID image, launcher variables", "hostile",
            f"{s['hostile']['clear']} exit 2 with one line naming it, before any run directory", "hostile"),
        row("resume: config.toml emptied / deleted, a non-UTF-8 flag, batch size changed mid-epoch, a step budget "
            "below the checkpoint, a finished run whose file times were lost", "resume",
            f"{s['resume']['survived']} continued bit-identical (or recognised as finished)", "resume"),
        row("a user's directory as --run_name; --resume auto beside a live run", "outside",
            f"{s['outside']['ok']} left alone", "outside"),
        row("a stop signal during set-up (imports, data, model)", "setup_signal",
            f"{s['setup_signal']['clean']} exit 128+N with one line", None),
        row("torchrun x2 (gloo), one worker killed, MAX_RESTARTS=1", "elastic",
            f"{s['elastic']['survived']} bit-identical", "elastic"),
    ]  # fmt: skip
    md = [
        "# Fault-injection campaign (CPU)",
        "",
        f"`python -m tests.fault_campaign {' '.join(cfg['argv'])}` on {result['environment']['cpu']} "
        f"({result['environment']['cpu_count']} cores), torch {result['environment']['torch']}, "
        f"commit {result['environment']['commit'][:12]}; {cfg['epochs']} epochs per run, "
        f"{result['seconds']:.0f} s in all.",
        "",
        md_table(["fault", "tried", "survived / caught", "runs lost"], rows),
        "",
        f"**Runs lost: {s['runs_lost']}** (goal 0).",
        "",
    ]
    if s["failures"]:
        md += ["Failures:", ""] + [f"- {f}" for f in s["failures"]] + [""]
    md += ["| case | ok | lost | s | detail |", "|---|---|---|---:|---|"]
    md += [
        f"| {c['kind']}: {c['name']} | {'yes' if c['ok'] else 'no'} | {'yes' if c['lost'] else ''} | "
        f"{c['seconds']:.1f} | {c['detail'].replace('|', '/')} |"
        for c in result["cases"]
    ]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kill -9 cases (default: 20)")
    ap.add_argument(
        "--signals", type=int, default=12, help="signal cases, cycling SIGTERM/SIGINT/SIGUSR1/SIGHUP (default: 12)"
    )
    ap.add_argument("--elastic", type=int, default=2, help="elastic restart cases (default: 2)")
    ap.add_argument("--no-elastic", dest="elastic", action="store_const", const=0)
    ap.add_argument("--elastic-args", default="", help="extra CLI flags for the elastic runs, one string")
    ap.add_argument("--epochs", type=int, default=12, help="epochs per run, 8 steps each (default: 12)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random kill/signal moments (default: 0)")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "faults_cpu.json"), help="result JSON (+ .md beside it)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="plainloop-faults-") as tmp:
        work = Path(args.work or tmp)
        camp = Campaign(work, epochs=args.epochs, seed=args.seed)
        camp.reference()
        for i in range(args.kills):
            camp.kill_case(i, mid_write=i % 2 == 1)  # every other kill aimed at a checkpoint being written
        camp.kill_case(args.kills, delay=0.0)  # before the first checkpoint: restarted with --resume auto
        names = list(SIGNALS)
        for i in range(args.signals):
            camp.signal_case(i, names[i % len(names)])
        camp.signal_case(args.signals, "SIGINT", twice=True)
        for mode in ("input", "output", "always", "lr1000"):
            camp.nan_case(mode)
        camp.collision_reuse_name()
        camp.collision_simultaneous(same_name=True)
        camp.collision_simultaneous(same_name=False)
        camp.collision_lock()
        camp.bad_inputs()
        camp.hostile_inputs()
        for what in ("config_empty", "config_missing", "bad_flag", "batch_size", "max_steps", "finished"):
            camp.resume_case(what)
        camp.user_directory_case()
        camp.resume_auto_live_case()
        for i, signame in enumerate(SIGNALS):
            camp.setup_signal_case(signame, 0.5 + 1.5 * i)  # imports, then data and model
        for i in range(args.elastic):
            camp.elastic_case(i, tuple(shlex.split(args.elastic_args)))
        result: dict[str, Any] = {
            "environment": environment(torch.device("cpu")),
            "config": {
                "argv": argv if argv is not None else sys.argv[1:],
                "epochs": args.epochs,
                "tiny": TINY,
                "checkpoint_every": 2,
                "seed": args.seed,
            },  # fmt: skip
            "summary": camp.summary(),
            "cases": [asdict(c) for c in camp.cases],
            "seconds": time.monotonic() - t0,
        }
    write_result(args.out, result, render(result))
    return 0 if result["summary"]["runs_lost"] == 0 and not result["summary"]["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
