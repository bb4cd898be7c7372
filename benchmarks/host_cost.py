"""Host cost per training step: the GPU-free proxy for how far a GPU can go when its kernels are short.

    .venv/bin/python -m benchmarks.host_cost                  # cpu and seed configurations, ~10 min here
    .venv/bin/python -m benchmarks.host_cost --quick          # the tiny configuration, seconds (a test)

For each configuration (CONFIGS) and loop, steps are timed between per-step marks, repetitions interleaved: the
wall time without the profiler; under torch.profiler the aten operators (all, and the outermost ones; on CUDA also
the kernel launches) and the host time inside the outermost operators and outside them (Python, the loop, the
autograd engine, data handling); and the reads of a tensor to the host that the loop's code makes (SyncCounter).
Medians over the steady steps (neither the first nor the last of an epoch); "incl. epoch ends" averages all timed
steps. docs/benchmarks/index.md ("Host cost per step") reads the figures.

Loops (same model, same data held in memory, same batch, AdamW):
  before          the seed loop's habits: DataLoader(num_workers=0) with per-sample __getitem__ + collate over the
                  cached data, optimizer.zero_grad(), loss.item() every step
  plainloop       trainer.Trainer with its defaults
  plainloop_gpu_path  the same loop taking its GPU path on the CPU: fused AdamW with a tensor learning rate (the
                  schedule on the device) and the guard's flag never read (`opt.host_reads = False`)
  lightning_data  lightning.Trainer on plainloop's data path (common.SAME_DATA_PEER)
On a CPU --seed-batch (default 2) sets the seed configuration's batch: a step at 150 takes about a minute, and
operator counts and host time outside the operators do not depend on the batch size.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks import common as bc
from trainer.hooks import Monitor

MARK = "hostcost::step_end"
_KEYS = ("steps", "warmup", "file_grid", "years", "resolution", "batch", "before_batch")
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {**dict(zip(_KEYS, (4, 2, 5.0, 25, 10.0, 40, 40))), "model": bc.MODEL_SIZES["tiny"]},
    "cpu": {**dict(zip(_KEYS, (12, 3, 1.0, 50, 5.0, 150, 50))), "model": bc.MODEL_SIZES["cpu"]},
    "seed": {**dict(zip(_KEYS, (6, 2, 1.0, 50, 2.0, 150, 50))), "model": bc.MODEL_SIZES["seed"]},
}
LOOPS = ("before", "plainloop", "plainloop_gpu_path", "lightning_data")
_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
FLAGS = [("--configs", "cpu,seed", f"comma list from {','.join(CONFIGS)}"),
         ("--loops", ",".join(LOOPS), f"comma list from {','.join(LOOPS)}"),
         ("--steps", None, "timed steps per pass (default: 12 cpu, 6 seed, 4 tiny)", {"type": int}),
         ("--warmup", None, "untimed steps first (default: 3 cpu, 2 seed/tiny)", {"type": int}),
         ("--seed-batch", None, "batch of the seed configuration (default: 150 on CUDA, 2 on a CPU)", {"type": int}),
         ("--device", None, "cuda or cpu (default: cuda when available)"),
         ("--cache-dir", None, "netCDF + coarse cache (default: $PLAINLOOP_CACHE or ~/.cache/plainloop)"),
         ("--quick", False, "the tiny configuration, 1 repetition, 4 steps (a test)"),
         ("--out", None, "JSON path (default: benchmarks/results/host_cost_<cpu|gpu>.json)")]  # fmt: skip


# ------------------------------------------------------------------------------------------ instruments
class Marks:
    """Per-step marks: a wall-clock time, a profiler event, whether the step ended its epoch, and the sync count;
    the sync counter counts from the `warmup`-th mark to the last one."""

    def __init__(self, warmup: int, steps: int, counter: SyncCounter | None = None) -> None:
        self.warmup, self.steps, self.counter = warmup, steps, counter
        self.times: list[float] = []
        self.last_in_epoch: list[bool] = []
        self.syncs: list[int] = []

    def mark(self, last_in_epoch: bool) -> None:
        with torch.profiler.record_function(MARK):
            self.times.append(time.perf_counter())
            self.last_in_epoch.append(last_in_epoch)
            self.syncs.append(self.counter.count("loop") if self.counter is not None else 0)
        if self.counter is not None:
            self.counter.active = self.warmup <= len(self.times) < self.warmup + self.steps

    @property
    def done(self) -> bool:
        return len(self.times) >= self.warmup + self.steps


class SyncCounter:
    """Counts tensor reads to the host (`_READS`) while `active`, by kind and by where they come from.

    On CUDA only reads of CUDA tensors count (each is a host-device sync). On a CPU every tensor is a host tensor, so
    a read is sorted by what it would be on a GPU: "loop" (made by the loop's code: trainer/, tasks/, models/, the
    loops here, Lightning; a read inside torch on their behalf is traced back to them), "host_resident" (torch's
    own reads of CPU-side state: the optimizer's step counters, the data loader's seeds) and "data_cpu_branch" (the
    dataset's gather when its data sits on the CPU). Only "loop" reads count as syncs per step."""

    def __init__(self, cuda_only: bool) -> None:
        self.active, self.cuda_only = False, cuda_only
        self.calls: Counter[str] = Counter()

    @contextlib.contextmanager
    def installed(self) -> Iterator[SyncCounter]:
        saved = {name: getattr(torch.Tensor, name) for name in _READS}
        for name, fn in saved.items():
            setattr(torch.Tensor, name, self._wrap(fn, name))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(torch.Tensor, name, fn)

    def count(self, kind: str = "loop") -> int:
        return sum(n for k, n in self.calls.items() if k.startswith(kind + "|"))

    def _wrap(self, orig: Callable, name: str) -> Callable:
        def wrapper(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            if self.active:
                f = sys._getframe(1)
                path = f.f_code.co_filename.replace("\\", "/")
                if self.cuda_only:
                    kind = "loop" if t.device.type == "cuda" else ""
                elif "/torch/optim/" in path or "/torch/utils/data/" in path:
                    kind = "host_resident"
                else:
                    kind = "data_cpu_branch" if "/datasets/" in path else "loop"
                if kind:
                    origin: Any = f
                    while origin is not None and "/torch/" in origin.f_code.co_filename.replace("\\", "/"):
                        origin = origin.f_back
                    origin = origin or f
                    where = "/".join(Path(origin.f_code.co_filename).parts[-2:])
                    self.calls[f"{kind}|{name} {where}:{origin.f_lineno}"] += 1
            return orig(t, *a, **k)

        return wrapper


# ------------------------------------------------------------------------------------------ the loops
def _task(c: dict[str, Any], cache_dir: Path, device_cache: bool | None, seed: int) -> Any:
    from datasets.era5_sample import ensure_sample_file
    from tasks.era5 import build_era5_task

    path = ensure_sample_file(cache_dir, years=c["years"], grid=c["file_grid"])
    return build_era5_task(data_path=str(path), resolution=c["resolution"], seq_len=2, device_cache=device_cache,
                           seed=seed, cache_dir=str(cache_dir), learning_rate=1e-3, **c["model"])  # fmt: skip


def loop_before(c: dict, cache_dir: Path, device: torch.device, batch: int, marks: Marks, seed: int) -> None:
    from benchmarks.before_loop import seed_step

    task = _task(c, cache_dir, False, seed)
    model = task.model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loader = DataLoader(task.train_set, batch_size=batch, shuffle=True, num_workers=0, pin_memory=False)
    while not marks.done:
        for i, (x, y) in enumerate(loader):
            seed_step(model, opt, x, y, device)
            marks.mark(i + 1 == len(loader))
            if marks.done:
                return


class _MarksMonitor(Monitor):
    """plainloop's monitor hook (the TrainingMonitor API): one mark per iteration."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.trainer: Any = None

    def log_iteration(self, seconds: float, data_seconds: float | None = None, samples: int | None = None) -> None:
        self.marks.mark(self.trainer.batches_done == self.trainer.batches_per_epoch)


def loop_plainloop(c: dict[str, Any], cache_dir: Path, device: torch.device, batch: int, marks: Marks, seed: int,
                   gpu_path: bool = False) -> None:  # fmt: skip
    from trainer import TrainConfig, Trainer
    from trainer.optim import build_adamw

    task = _task(c, cache_dir, None, seed)
    if gpu_path:  # the model's own optimizer wins: the GPU's AdamW (tensor lr, the schedule on the device)
        task.model.configure_optimizers = lambda: build_adamw(task.model, 1e-3, 0.01, device, tensor_lr=True)
    mon = _MarksMonitor(marks)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(max_steps=marks.warmup + marks.steps, batch_size=batch, output_dir=tmp, seed=seed,
                          device=str(device), progress_bar=True)  # fmt: skip
        mon.trainer = trainer = Trainer(cfg, task, log=lambda _s: None, monitor=mon)
        if gpu_path:
            trainer.opt.host_reads = False  # the guard's flag stays on the device, as on a GPU
        trainer.fit()


def loop_lightning_data(c: dict[str, Any], cache_dir: Path, device: torch.device, batch: int, marks: Marks,
                        seed: int) -> None:  # fmt: skip
    import lightning as L

    task = _task(c, cache_dir, None, seed)
    loader, _ = bc.peer_loaders(task.train_set, None, device, batch, bc.SAME_DATA_PEER, {}, seed)

    class Mark(L.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, b: Any, i: int) -> None:
            marks.mark(i + 1 == trainer.num_training_batches)

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_steps=marks.warmup + marks.steps,
            precision=bc.lightning_precision(device),  # type: ignore[arg-type]
            logger=False, default_root_dir=tmp, enable_model_summary=False, enable_progress_bar=False,
            callbacks=[Mark()],
        )  # fmt: skip
        trainer.fit(bc.peer_module(task.model, 1e-3, device, bc.SAME_DATA_PEER), loader)


RUNNERS: dict[str, Callable[..., None]] = {
    "before": loop_before, "plainloop": loop_plainloop, "lightning_data": loop_lightning_data,
    "plainloop_gpu_path": functools.partial(loop_plainloop, gpu_path=True),
}  # fmt: skip


# ------------------------------------------------------------------------------------------ measurement
def _window(marks: Marks) -> list[tuple[int, bool]]:
    """(index of the step's closing mark, steady?) for every timed step. A step is steady when it is neither the
    first of its epoch (new iterator, the previous epoch's checkpoint and validation) nor the last (the epoch-end
    log point)."""
    lo, hi, last = marks.warmup, min(len(marks.times), marks.warmup + marks.steps), marks.last_in_epoch
    return [(k, not last[k - 1] and not last[k]) for k in range(max(lo, 1), hi)]


def timed_pass(run: Callable[..., None], args: tuple, device: torch.device, warmup: int, steps: int) -> dict:
    """Wall time per step and host reads per step, without the profiler."""
    counter = SyncCounter(cuda_only=device.type == "cuda")
    marks = Marks(warmup, steps, counter)
    with counter.installed():
        run(*args, marks)
    win = _window(marks)
    walls = [marks.times[k] - marks.times[k - 1] for k, _ in win]
    syncs = [marks.syncs[k] - marks.syncs[k - 1] for k, _ in win]
    inner, n = [i for i, (_, ok) in enumerate(win) if ok] or list(range(len(win))), len(win)
    return {
        "steps_raw": {"wall_s": walls, "syncs": syncs, "steady": [ok for _, ok in win]},
        "step_us_median": 1e6 * bc.stats([walls[i] for i in inner])["median"],
        "step_us_incl_epoch_ends": 1e6 * sum(walls) / n,
        "syncs_per_step": bc.stats([syncs[i] for i in inner])["median"],
        "syncs_per_step_incl_epoch_ends": counter.count("loop") / n,
        "host_reads_per_step": sum(counter.calls.values()) / n, "sync_callers": dict(counter.calls.most_common(16)),
        "timed_steps": n, "steady_steps": sum(ok for _, ok in win),
    }  # fmt: skip


def profiled_pass(run: Callable[..., None], args: tuple, device: torch.device, warmup: int, steps: int) -> dict:
    """Operator calls and host time inside/outside the outermost operators per step, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    from utils.profiling import _native_output_to  # kineto's lines go to fds 1/2 directly

    marks = Marks(warmup, steps)
    with _native_output_to([]):
        prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else []))
        prof.__enter__()
    try:
        run(*args, marks)
    finally:
        with _native_output_to([]):
            prof.__exit__(None, None, None)
    events = list(prof.events())
    starts = sorted(e.time_range.start for e in events if e.name == MARK)
    per = [{"ops": 0, "outer_ops": 0, "in_ops_us": 0.0, "launches": 0, "dev_syncs": 0} for _ in starts]
    for e in events:  # every thread: on CUDA the autograd engine runs the backward on a device thread
        k = bisect.bisect_right(starts, e.time_range.start)  # the step whose closing mark comes next
        if k >= len(starts) or e.name == MARK:
            continue
        if e.name.startswith("aten::"):
            per[k]["ops"] += 1
            if not any(p.name.startswith("aten::") for p in bc.ancestors(e)):  # an outermost one
                per[k]["outer_ops"] += 1
                per[k]["in_ops_us"] += e.time_range.end - e.time_range.start
        elif e.name.startswith("cuda"):
            per[k]["launches"] += "Launch" in e.name
            per[k]["dev_syncs"] += "Synchronize" in e.name
    win = [(k, ok) for k, ok in _window(marks) if k < len(starts)]
    inner = [k for k, ok in win if ok] or [k for k, _ in win]
    wall = {k: starts[k] - starts[k - 1] for k, _ in win}

    def med(f: Callable[[int], float]) -> float:
        return bc.stats([f(k) for k in inner])["median"]

    out = {
        "profiled_steps_raw": {"wall_us": [wall[k] for k, _ in win], "steady": [ok for _, ok in win],
                               **{key: [per[k][key] for k, _ in win] for key in ("in_ops_us", "ops", "outer_ops")}},
        "profiled_step_us_median": med(lambda k: wall[k]), "ops_per_step": med(lambda k: per[k]["ops"]),
        "outer_ops_per_step": med(lambda k: per[k]["outer_ops"]), "in_ops_us_median": med(lambda k: per[k]["in_ops_us"]),
        "outside_ops_us_median": med(lambda k: wall[k] - per[k]["in_ops_us"]),
        "outside_ops_us_incl_epoch_ends": sum(wall[k] - per[k]["in_ops_us"] for k, _ in win) / len(win),
        "ops_per_step_incl_epoch_ends": sum(per[k]["ops"] for k, _ in win) / len(win),
    }  # fmt: skip
    if device.type == "cuda":
        out["kernel_launches_per_step"] = med(lambda k: per[k]["launches"])
        out["cuda_syncs_per_step"] = sum(per[k]["dev_syncs"] for k, _ in win) / len(win)
    return out


# ------------------------------------------------------------------------------------------ report
def summarise(reps: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict[str, Any]]]:
    return {cfg: {loop: {**{k: bc.stats([r[k] for r in rs]) for k, v in rs[0].items()
                            if isinstance(v, int | float) and not isinstance(v, bool)},
                         "sync_callers": rs[-1].get("sync_callers", {})} for loop, rs in loops.items()}
            for cfg, loops in reps.items()}  # fmt: skip


def render(result: dict[str, Any]) -> str:
    env, cfg = result["environment"], result["config"]
    load = bc.fmt((result["loadavg_start"] or [None])[0], ".2f")
    parts = [f"Host cost per training step on {env['device_name']} ({env['device']}), torch {env['torch']}, commit "
             f"`{env['commit'][:12]}`, {env['time_utc']}, load average {load} "
             f"at the start; {cfg['reps']} interleaved repetitions; medians over the steady steps, (min–max) over the "
             f"repetitions; {cfg['torch_threads']} torch thread(s). Command: `{result['command']}`."]  # fmt: skip
    keys = [("step_us_median", ".0f", True), ("outside_ops_us_median", ".0f", True), ("in_ops_us_median", ".0f", False),
            ("ops_per_step", ".0f", False), ("outer_ops_per_step", ".0f", False),
            ("kernel_launches_per_step", ".0f", False), ("syncs_per_step", ".2f", False),
            ("syncs_per_step_incl_epoch_ends", ".2f", False), ("host_reads_per_step", ".2f", False)]  # fmt: skip
    header = ["loop", "step µs", "host µs outside ops", "µs inside ops", "aten ops/step", "outermost ops/step",
              "kernel launches/step", "syncs/step" + ("" if env["device"].startswith("cuda") else
              " (loop's reads, syncs on a GPU)"), "syncs/step incl. epoch ends", "all host reads/step"]  # fmt: skip

    def cell(v: dict[str, Any] | None, k: str, spec: str, spread: bool) -> str:
        if not v:
            return "n/a (CPU)" if "kernel" in k else "n/a"
        return f"{v['median']:{spec}}" + (f" ({v['min']:{spec}}–{v['max']:{spec}})" if spread and v["n"] > 1 else "")

    for name, loops in result["summary"].items():
        c = result["configs"][name]
        rows = [[loop, *(cell(s.get(k), k, spec, spread) for k, spec, spread in keys)] for loop, s in loops.items()]
        parts.append(f"**{name}**: {c['describe']}, batch {c['batch']} (before: {c['before_batch']}), {c['steps']} "
                     f"timed steps after {c['warmup']}\n\n" + bc.md_table(header, rows))  # fmt: skip
    return "\n\n".join(parts + [f"- {n}" for n in result["notes"]]) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # 1 thread: host cost is single-threaded, and on a shared machine a descheduled second thread stalls every op
    ap = bc.parser(__doc__, FLAGS, timing=(3, 1))
    a = ap.parse_args(argv)
    if a.quick:
        a.configs, a.reps = "tiny", 1
    configs, loops = bc.comma_list(ap, "--configs", a.configs, CONFIGS), bc.comma_list(ap, "--loops", a.loops, LOOPS)
    if (a.steps is not None and a.steps < 2) or (a.warmup is not None and a.warmup < 1):
        ap.error(f"--steps {a.steps} / --warmup {a.warmup}: need steps >= 2, warmup >= 1")
    device, notes = bc.device_of(a.device), []
    if "lightning_data" in loops and bc.lightning_available() is None:
        loops.remove("lightning_data")
        notes.append("lightning is not installed: its row is skipped (pip install lightning)")
    if device.type == "cuda" and "plainloop_gpu_path" in loops:
        loops.remove("plainloop_gpu_path")  # on CUDA, plainloop's own path is the GPU path
    cache_dir, seed_batch = bc.cache_dir_of(a.cache_dir), a.seed_batch or (150 if device.type == "cuda" else 2)
    cfgs = {k: dict(CONFIGS[k]) for k in configs}
    for c in cfgs.values():
        m = c["model"]
        c.update(steps=a.steps or c["steps"], warmup=a.warmup or c["warmup"],
                 describe=f"d_model {m['d_model']}, {m['num_layers']} layers x {m['recursion_depth']} recursions, "
                          f"{c['resolution']:g}° grid from a {c['file_grid']:g}° file")  # fmt: skip
    if "seed" in cfgs:
        cfgs["seed"]["batch"] = cfgs["seed"]["before_batch"] = seed_batch
        if seed_batch != 150:
            notes.append(f"seed configuration at batch {seed_batch} (the seed's is 150): a CPU step at 150 takes about "
                         "a minute; operator counts and host time outside operators do not depend on it")  # fmt: skip
    env, load_start = bc.environment(device), bc.loadavg()  # at the start: the commit that is measured
    reps: dict[str, dict[str, list[dict[str, Any]]]] = {k: {lp: [] for lp in loops} for k in cfgs}
    for r in range(a.reps):
        a.wait(r)
        for k, c in cfgs.items():
            for lp in loops:  # interleaved
                args = (c, cache_dir, device, c["before_batch"] if lp == "before" else c["batch"])
                run = functools.partial(RUNNERS[lp], seed=0)
                rec = {**timed_pass(run, args, device, c["warmup"], c["steps"]),
                       **profiled_pass(run, args, device, c["warmup"], c["steps"]),
                       "rep": r, "loadavg_1m": (bc.loadavg() or [0.0])[0]}  # fmt: skip
                reps[k][lp].append(rec)
                print(f"[host_cost] rep {r + 1}/{a.reps} {k:5s} {lp:18s} step {rec['step_us_median']:9.0f} µs, "
                      f"outside ops {rec['outside_ops_us_median']:8.0f} µs, {rec['ops_per_step']:5.0f} ops, "
                      f"{rec['syncs_per_step']:.2f} reads/step", flush=True)  # fmt: skip
    result = {
        "schema": "plainloop-bench-host-cost-1", "command": bc.command("host_cost", a.argv), "environment": env,
        "loadavg_start": load_start, "loadavg_end": bc.loadavg(), "waited_for_quiet": a.waits,
        "config": {"reps": a.reps, "loops": loops, "torch_threads": torch.get_num_threads()},
        "configs": cfgs, "repetitions": reps, "summary": summarise(reps), "notes": notes,
    }  # fmt: skip
    out = Path(a.out) if a.out else bc.RESULTS_DIR / f"host_cost_{'gpu' if device.type == 'cuda' else 'cpu'}.json"
    bc.write_result(out, result, render(result))
    return result


if __name__ == "__main__":
    main()
