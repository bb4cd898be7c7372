"""What every harness under benchmarks/ shares: the environment record, the command line, timing, statistics and
targets, the JSON and Markdown output, and Lightning, the peer plainloop is measured against.

Lightning (a benchmark-only dependency, requirements-bench.txt) in two set-ups:
  SEED_PEER       as the seed guides' BaseTrainer: "16-mixed", 8 workers, pinned, persistent, prefetch 2, torch's
                  AdamW, validation every epoch, progress bar, reading plainloop's cached dataset via a DataLoader
  SAME_DATA_PEER  only the loop differs: plainloop's split gathered by index in its order, 0 workers, its precision
                  and AdamW, validation as often as its default and (peer["evaluate"]) the task's own scoring
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset

from benchmarks.sizes import CPU_MODEL, TINY_MODEL
from tasks.era5 import SEED_PRESET
from trainer.config import validation_every
from trainer.runtime import resolve_runtime
from utils.performance_monitor import usable_cpus

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# RecursiveAttentionTransformer sizes; "seed" is the seed guides' model (the CLI's seed preset less grid and context)
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": TINY_MODEL,
    "cpu": CPU_MODEL,
    "seed": {k: v for k, v in SEED_PRESET.items() if k not in ("resolution", "seq_len")},
}


# ------------------------------------------------------------------------------------------ environment
def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str:
    """HEAD's hash (+"+dirty" when the tree has changes outside benchmarks/results), or "uncommitted"."""
    root = Path(__file__).resolve().parent.parent
    head = _run(["git", "rev-parse", "HEAD"], root)
    if not head:
        return "uncommitted"
    # result files are outputs: a run that follows another one's freshly written JSON is still clean
    dirty = _run(["git", "status", "--porcelain", "--", ".", ":(exclude)benchmarks/results"], root)
    return head + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def optional_modules() -> dict[str, str | None]:
    """Versions of the optional packages a benchmark may use; None = missing (the harness says what it skips)."""
    out: dict[str, str | None] = {}
    for name in ("lightning", "netCDF4", "psutil", "tqdm", "pynvml", "numpy", "xarray", "dask"):
        try:
            out[name] = str(getattr(__import__(name), "__version__", "present"))
        except Exception:  # a broken optional install counts as missing
            out[name] = None
    return out


def environment(device: torch.device) -> dict[str, Any]:
    """Where the figures come from: machine, device, driver, library versions and the code's commit."""
    cuda = device.type == "cuda"
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None
    return {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": _cpu_model(),
        "cpu_count": usable_cpus(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else _cpu_model(),
        "driver": driver.splitlines()[0] if driver else None,
        "commit": git_commit(),
        "modules": optional_modules(),
        "loadavg": loadavg(),
    }


def loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS has none): recorded beside every timing."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def wait_for_quiet(max_load: float, max_wait_s: float, poll_s: float = 60.0) -> dict[str, Any]:
    """Wait until the 1-minute load average is below `max_load`, at most `max_wait_s` seconds; says how long it
    waited and the load when it stopped (quiet or not): timings on a shared machine are worth keeping when quiet."""
    t0 = time.monotonic()
    while True:
        la, waited = loadavg(), time.monotonic() - t0
        if la is None or la[0] < max_load or waited >= max_wait_s:
            quiet = la is None or la[0] < max_load
            if not quiet and la is not None:
                print(f"[bench] load average {la[0]:.2f} still >= {max_load} after {waited:.0f} s; going on")
            return {"max_load": max_load, "waited_s": round(waited, 1), "loadavg": la, "quiet": quiet}
        print(f"[bench] load average {la[0]:.2f} >= {max_load}: waiting ({waited:.0f} s so far)", flush=True)
        time.sleep(min(poll_s, max(1.0, max_wait_s - waited)))


def parser(doc: str | None, flags: Sequence[tuple[Any, ...]] = (),
           timing: tuple[int | None, int] | None = None) -> _Parser:  # fmt: skip
    """A parser described by the module's docstring, with (flag, default, help[, argparse keywords]) rows: the type
    is the default's (False makes a switch) and the help names the default.

    timing = (reps, threads): a timing harness's flags first, --reps, --threads, --wait-load and --wait-max;
    parse_args() then checks them, sets torch's threads and adds `wait(rep)` (waits for quiet when --wait-load is
    given; returns the load average), `waits` (what each wait found) and `argv` (the command line as given)."""
    doc = doc or ""
    ap = _Parser(description=doc.split("\n\n")[0], epilog=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if timing is not None:
        ap.timing = True
        reps = "interleaved repetitions" + (" (default: the preset's)" if timing[0] is None else "")
        flags = [("--reps", timing[0], reps, {"type": int}),
                 ("--threads", timing[1], "torch threads, 0 = torch's own"),
                 ("--wait-load", 0.0, "before each repetition, wait until the 1-minute load average is below this "
                  "(at most --wait-max s in all); 0 = do not wait"),
                 ("--wait-max", 3600.0, "longest wait in all, seconds"), *flags]  # fmt: skip
    for name, default, what, *more in flags:
        kw: dict[str, Any] = dict(more[0]) if more else {}
        if default is False:
            kw.setdefault("action", "store_true")
        elif default is not None and not {"nargs", "action", "type"} & set(kw):
            kw["type"] = type(default)
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else default
        plain = default is False or default is None  # a switch, or a help that says what happens without it
        ap.add_argument(name, default=default, help=what if plain else f"{what} (default: {shown})", **kw)
    return ap


class _Parser(argparse.ArgumentParser):
    timing = False

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        a = super().parse_args(args, namespace)
        if not self.timing:
            return a
        if (a.reps is not None and a.reps < 1) or a.threads < 0:
            self.error(f"--reps {a.reps} / --threads {a.threads}: need reps >= 1 and threads >= 0")
        if a.threads > 0:
            torch.set_num_threads(a.threads)
        deadline = time.monotonic() + a.wait_max
        a.waits = []

        def wait(rep: int) -> list[float] | None:
            if a.wait_load > 0:
                a.waits.append(wait_for_quiet(a.wait_load, max(0.0, deadline - time.monotonic())))
            return loadavg()

        a.wait, a.argv = wait, list(sys.argv[1:] if args is None else args)
        return a

    def config(self, a: argparse.Namespace) -> dict[str, Any]:
        """The parsed flags as a JSON-able config."""
        return {k: v for k, v in vars(a).items() if k not in ("wait", "argv", "waits")}


def comma_list(ap: argparse.ArgumentParser, flag: str, text: str, known: Collection[str]) -> list[str]:
    """The items of a comma list given to `flag`, each one of `known`."""
    items = [x for x in text.split(",") if x]
    if bad := [x for x in items if x not in known]:
        ap.error(f"{flag}: unknown {bad}; choose from {','.join(known)}")
    return items


def device_of(name: str | None) -> torch.device:
    """The device asked for, else CUDA when there is one."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def cache_dir_of(path: str | None) -> Path:
    """--cache-dir, else plainloop's cache ($PLAINLOOP_CACHE or ~/.cache/plainloop); made if missing."""
    from datasets.era5 import default_cache_dir

    out = Path(path).expanduser() if path else default_cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    return out


def command(module: str, argv: Sequence[str] | None) -> str:
    """The command line that ran a harness, as the results record it."""
    return f"python -m benchmarks.{module} " + " ".join(sys.argv[1:] if argv is None else argv)


def epoch_ends(metrics: Path) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """A run's train rows from its metrics.jsonl and the time of each epoch's last row (every epoch ends in one)."""
    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"]
    ends: dict[int, float] = {}
    for r in rows:
        ends[r["epoch"]] = max(ends.get(r["epoch"], -math.inf), r["time"])
    return rows, ends


def step_times(run_dir: str | os.PathLike[str]) -> dict[int, float]:
    """The time of each logged training step of a plainloop run (its metrics.jsonl)."""
    return {r["step"]: r["time"] for r in epoch_ends(Path(run_dir) / "metrics.jsonl")[0]}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: sync point (timing boundary)


def matmul_peak_flops(device: torch.device, n: int | None = None, iters: int | None = None) -> dict[str, Any]:
    """Measured dense matmul peak (FLOP/s): bf16 on CUDA, fp32 on a CPU (the precision each runs); the best of
    several timed batches of n x n products, so the figure is what this device reaches today, not a datasheet's."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    n, iters = n or (8192 if cuda else 1024), iters or (20 if cuda else 4)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    flops = 2.0 * n**3 * iters / best
    return {"flops": flops, "tflops": flops / 1e12, "dtype": str(dtype).replace("torch.", ""), "n": n, "iters": iters}


# ------------------------------------------------------------------------------------------ the profiler
def ancestors(e: Any) -> Iterator[Any]:
    """The events around a profiler event on its thread, innermost first."""
    p = e.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


def mark(name: str) -> None:
    """An instant in the profile: the summaries cut the steps at these."""
    with record_function(name):
        pass


@contextlib.contextmanager
def swapped(obj: Any, name: str, new: Any) -> Iterator[None]:
    """obj.name is `new` while the block runs (an attribute of a module, a class or one object), then as before."""
    own, before = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, new)
    try:
        yield
    finally:
        if own:
            setattr(obj, name, before)
        else:
            delattr(obj, name)


def labelled(obj: Any, name: str, label: str) -> contextlib.AbstractContextManager[None]:
    """obj.name (a method) runs inside record_function(label) while the block runs."""
    orig = getattr(obj, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        with record_function(label):
            return orig(*a, **k)

    return swapped(obj, name, wrapped)


class Window:
    """torch.profiler over part of a run: started and stopped once, where the harness says; marks while it is on."""

    def __init__(self, device: torch.device, with_stack: bool = False) -> None:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof, self.on, self.done = profile(activities=acts, with_stack=with_stack), False, False

    def start(self) -> None:
        if not self.on and not self.done:
            self.prof.start()
            self.on = True

    def mark(self, name: str) -> None:
        if self.on:
            mark(name)

    def stop(self) -> None:
        if self.on:
            self.on, self.done = False, True
            self.prof.stop()


# ------------------------------------------------------------------------------------------ statistics
def stats(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repetitions: min, max and the relative spread (max - min) / median."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("stats: no values (did every repetition fail?)")
    med = statistics.median(vals)
    return {"median": med, "min": min(vals), "max": max(vals), "spread": (max(vals) - min(vals)) / med if med else 0.0,
            "n": len(vals)}  # fmt: skip


def paired(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The median of the per-repetition ratios a[i] / b[i]: robust to a slow patch of a shared machine that hits
    every row of one interleaved repetition."""
    ratios = [x / y for x, y in zip(a, b) if y]
    return stats(ratios)["median"] if ratios else None


def target_check(what: str, value: float | None, paired_value: float | None, goal: float, higher: bool = True,
                 unit: str = "", config: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A target met or missed: `value` (a ratio of medians, or a figure) must reach `goal`, and so must the paired
    ratio when there is one. None (not measured) is never met."""

    def ok(v: float | None) -> bool:
        return v is not None and (v >= goal if higher else v <= goal)

    met = ok(value) and (paired_value is None or ok(paired_value))
    return {"target": what, "config": config, "value": value, "paired": paired_value, "goal": goal,
            "direction": ">=" if higher else "<=", "unit": unit, "met": met}  # fmt: skip


# ------------------------------------------------------------------------------------------ output
def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomic write, so a crash never leaves half a result file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p


def write_result(out: str | os.PathLike[str], result: Any, md: str) -> Path:
    """The raw JSON and its rendered Markdown table side by side (out and out.md); the table is printed."""
    path = write_json(out, result)
    path.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)
    return path


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join("" if v is None else str(v) for v in r) + " |" for r in rows])


def fmt(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:{spec}}{suffix}"


# ------------------------------------------------------------------------------------------ the Lightning peer
@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A loop's console output kept off the benchmark's: plainloop's lines and Lightning's progress bar and notes
    still run and are written, to a buffer (Lightning's bar is part of its defaults: measured, not switched off)."""
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # "GPU available: ...", tips, "`Trainer.fit` stopped": outside the timed steps
        lg.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


SEED_LOADER = {"num_workers": 8, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2}
SEED_PEER: dict[str, Any] = {"data": "loader", "progress_bar": True, "optimizer": "torch", "val_every": 1}
SAME_DATA_PEER: dict[str, Any] = {"data": "gather", "progress_bar": False, "optimizer": "plainloop",
                                  "val_every": "auto"}  # fmt: skip
LIGHTNING_PRECISION = {"32": "32-true", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}


def lightning_precision(device: torch.device) -> str:
    """plainloop's own precision on `device` (precision "auto" resolved), as Lightning names it."""
    return LIGHTNING_PRECISION[resolve_runtime("auto", str(device)).precision]


def lightning_available() -> str | None:
    """Lightning's version, or None when it is not installed (the harness then skips its rows and says so)."""
    try:
        import lightning

        return str(lightning.__version__)
    except ImportError:
        return None


class GatherBatches(Dataset[Any]):
    """Whole batches from a dataset held in memory, `[idx]` -> `dataset.gather(idx)`: plainloop's path. With
    `DataLoader(batch_size=None, sampler=<a batch sampler>)` there is no per-sample __getitem__ and no collate."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: Any) -> Any:
        return self.dataset.gather(torch.as_tensor(idx, dtype=torch.long))


def peer_loaders(train_set: Any, val_set: Any, device: torch.device, batch_size: int, peer: dict[str, Any],
                 loader: dict[str, Any], seed: int) -> tuple[DataLoader[Any], DataLoader[Any] | None]:  # fmt: skip
    if peer["data"] == "gather":
        from trainer.data import ShardedBatchSampler

        for ds in (train_set, val_set):  # plainloop's residency: the split's normalised array in memory
            if ds is not None and not ds.maybe_to_device(device):
                raise RuntimeError(f"{type(ds).__name__} refused to be held on {device}: no like-for-like row")
        order = ShardedBatchSampler(len(train_set), batch_size, seed=seed, drop_last=True)
        train = DataLoader(GatherBatches(train_set), batch_size=None, sampler=order)
        if val_set is None or not len(val_set):
            return train, None
        val_order = ShardedBatchSampler(len(val_set), batch_size, shuffle=False, drop_last=False)
        return train, DataLoader(GatherBatches(val_set), batch_size=None, sampler=val_order)
    kw = dict(loader)
    if kw.get("num_workers", 0) == 0:
        kw.pop("persistent_workers", None)
        kw.pop("prefetch_factor", None)
    val = DataLoader(val_set, batch_size=batch_size, shuffle=False, **kw) if val_set is not None else None
    return DataLoader(train_set, batch_size=batch_size, shuffle=True, **kw), val


def peer_module(model: torch.nn.Module, lr: float, device: torch.device, peer: dict[str, Any]) -> Any:
    """A LightningModule around a plainloop task's model: its loss, logged per step, and the peer's AdamW.
    Validation scores the loss per batch, or with peer["evaluate"] (a task's evaluate_fn) the task's scores."""
    evaluate: Callable[..., dict[str, float]] | None = peer.get("evaluate")
    import lightning as L

    class SeedModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.model.loss(self.model(batch[0]), batch[1])  # type: ignore[operator]
            self.log("train_loss", loss, prog_bar=peer["progress_bar"])
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            if evaluate is None:  # else the task's scoring, below, reads the split itself
                loss = self.model.loss(self.model(batch[0]), batch[1])  # type: ignore[operator]
                self.log("val_loss", loss, prog_bar=peer["progress_bar"])

        def on_validation_epoch_end(self) -> None:
            if evaluate is not None:  # what plainloop's validation runs: the task's scores, under its autocast
                with self.trainer.precision_plugin.forward_context():
                    self.log("val_loss", evaluate(self.model, "val", device)["val_loss"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            if peer["optimizer"] == "plainloop":
                from trainer.optim import build_adamw

                return build_adamw(self.model, lr, 0.01, device, tensor_lr=False)
            return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)

    return SeedModule()


def run_lightning(model: torch.nn.Module, train_set: Any, val_set: Any, device: torch.device, epochs: int = 1,
                  warmup_epochs: int = 1, batch_size: int = 150, lr: float = 1e-3, precision: str = "16-mixed",
                  loader: dict[str, Any] | None = None, monitor: Any = None, seed: int = 0,
                  peer: dict[str, Any] | None = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:  # fmt: skip
    """Fit for warmup_epochs + epochs; time the last `epochs` (training + validation + checkpointing).
    peer["val_every"]: epochs between validations; None: the last epoch only; "auto": plainloop's default.

    Data wait has the definition of plainloop's monitor: from the end of the previous step (or the epoch start)
    until the batch reaches training_step."""
    import lightning as L

    peer, loader = dict(peer or SEED_PEER), dict(loader or SEED_LOADER)
    total = warmup_epochs + epochs
    val_every = validation_every(None, total)[0] if peer["val_every"] == "auto" else peer["val_every"] or total
    torch.manual_seed(seed)
    train_loader, val_loader = peer_loaders(train_set, val_set, device, batch_size, peer, loader, seed)
    marks: dict[str, list[float]] = {"epoch_end": [], "samples": [], "data_s": [], "step_s": []}

    class Clock(L.Callback):
        t_prev = t_start = 0.0

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.t_prev = time.perf_counter()
            if trainer.current_epoch == warmup_epochs and monitor is not None:
                monitor.start_monitoring()
            for k in ("samples", "data_s", "step_s"):
                marks[k].append(0.0)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.t_start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            t = time.perf_counter()
            data, step, n = self.t_start - self.t_prev, t - self.t_prev, int(batch[0].shape[0])
            marks["samples"][-1] += n
            marks["data_s"][-1] += data
            marks["step_s"][-1] += step
            if monitor is not None and trainer.current_epoch >= warmup_epochs:
                monitor.log_iteration(step, data, n)
            self.t_prev = t

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            sync(device)  # the epoch's timing boundary
            marks["epoch_end"].append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, precision=precision,  # type: ignore[arg-type]
            max_epochs=total, logger=False, default_root_dir=tmp, enable_model_summary=False,
            enable_progress_bar=peer["progress_bar"], num_sanity_val_steps=0, callbacks=[Clock(), *callbacks],
            check_val_every_n_epoch=val_every,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "does not have many workers" etc.: the seed's settings on purpose
            trainer.fit(peer_module(model, lr, device, peer), train_loader, val_loader)
        resolved = str(trainer.precision)
    if monitor is not None:
        monitor.stop_monitoring()
    ends = marks["epoch_end"]
    if len(ends) < total:
        raise RuntimeError(f"Lightning ran {len(ends)} epochs, expected {total}")
    timed = slice(warmup_epochs, total)
    return {
        "wall_s": ends[-1] - ends[warmup_epochs - 1] if warmup_epochs > 0 else None,
        "samples": int(sum(marks["samples"][timed])),
        "steps": len(train_loader) * epochs,
        "data_wait_s": sum(marks["data_s"][timed]),
        "step_s": sum(marks["step_s"][timed]),
        "precision_requested": precision,
        "precision_resolved": resolved,
        "loader": {"gather": "dataset.gather, 0 workers"} if peer["data"] == "gather" else loader,
        "peer": peer,
    }
