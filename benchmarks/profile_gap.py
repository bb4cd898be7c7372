"""Where the GPU waits: a torch.profiler trace of plainloop and of Lightning on the same data path, summarised.

    .venv/bin/python -m benchmarks.profile_gap --preset seed          # a GPU box (benchmarks/run_gpu.sh runs it)
    .venv/bin/python -m benchmarks.profile_gap --preset tiny          # any machine, a minute

Each loop trains benchmarks.run's ERA5 task (plainloop's defaults; Lightning as SAME_DATA_PEER: the same split in
memory, gathered in the same order, the same precision and AdamW). After --warmup-epochs untimed epochs the profiler
records whole epochs until at least --steps steps are in, the last of them validating, and stops at the first step
of the next epoch, so the trace holds every part of an epoch end. The summary:
  busy        per step, the time the device computes: CUDA kernels, copies and sets, attributed to the step that
              launched them; on a CPU run, the outermost operators of the main thread
  gaps        each interval of at least --min-gap-us in which the device computes nothing, with its likely cause,
              the first that applies: checkpoint (inside the save, or its copies), validation, data (a DataLoader
              fetch), sync (a host read or synchronize just ended), allocator (cudaMalloc or cudaFree), epoch end
              (between epochs, none of those), host launches (the host was still issuing the next work)
Writes raw JSON (every gap, with the host operators that overlap it) and a Markdown table to --out.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function

from benchmarks import common as bc
from benchmarks.run import PRESETS, Bench, _build_task, prepare_data

STEP, EPOCH, VAL, CKPT = (f"profile_gap::{k}" for k in ("step_end", "epoch_end", "validation", "checkpoint"))
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CAUSES = ("checkpoint", "validation", "data", "sync", "allocator", "epoch end", "host launches")
_SYNC = ("Synchronize", "cudaMemcpy ", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero")
FLAGS = [("--preset", "tiny", "problem size", {"choices": sorted(PRESETS)}),
         ("--device", None, "cuda or cpu (default: cuda when available)"),
         ("--steps", 10, "least steps in the trace"), ("--warmup-epochs", 2, "untraced epochs first"),
         ("--min-gap-us", 20.0, "shortest idle gap counted"),
         ("--loops", "plainloop,lightning_data", "plainloop and/or lightning_data"),
         ("--cache-dir", None, "generated data and cache (default: ~/.cache/plainloop)"),
         ("--out", None, "JSON path (default: benchmarks/results/profile_gap_<device>.json)")]  # fmt: skip


class Window(bc.Window):
    """The profiler on from epoch `first` to the first step end after epoch `stop_epoch`, and the marks inside it."""

    def __init__(self, device: torch.device, first: int, stop_epoch: int) -> None:
        super().__init__(device)
        self.first, self.stop_epoch = first, stop_epoch
        self.val: Any = None

    def epoch_start(self, epoch: int) -> None:
        if epoch == self.first:
            self.start()

    def step_end(self, epoch: int) -> None:
        self.mark(STEP)
        if epoch > self.stop_epoch:
            self.stop()

    def val_start(self) -> None:
        if self.on:
            self.val = record_function(VAL)
            self.val.__enter__()

    def val_end(self) -> None:
        if self.val is not None:
            self.val.__exit__(None, None, None)
            self.val = None


def trace_plainloop(b: Bench, w: Window, epochs: int) -> None:
    from trainer import Callback, TrainConfig, Trainer
    from trainer.state import Checkpointer

    class Hooks(Callback):
        def on_train_epoch_start(self, trainer: Any, epoch: int) -> None:
            w.epoch_start(epoch)

        def on_train_batch_end(self, trainer: Any, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
            w.step_end(trainer.progress.epoch)

        def on_train_epoch_end(self, trainer: Any, epoch: int) -> None:
            w.mark(EPOCH)

        def on_validation_start(self, trainer: Any) -> None:
            w.val_start()

        def on_validation_end(self, trainer: Any, metrics: dict[str, float]) -> None:
            w.val_end()

    with tempfile.TemporaryDirectory() as tmp, bc.labelled(Checkpointer, "save", CKPT):
        cfg = TrainConfig(epochs=epochs + 1, batch_size=b.p["batch"], output_dir=tmp, run_name="profile", seed=b.seed,
                          device=str(b.device), validation_interval=epochs, progress_bar=False)  # fmt: skip
        Trainer(cfg, _build_task(b, None), log=lambda _s: None, callbacks=[Hooks()]).fit()


def trace_lightning(b: Bench, w: Window, epochs: int) -> None:
    import lightning as L

    class Hooks(L.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            w.epoch_start(trainer.current_epoch)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            w.step_end(trainer.current_epoch)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            w.mark(EPOCH)

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            w.val_start()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            w.val_end()

    task, warmup = _build_task(b, None), w.first
    precision = bc.lightning_precision(b.device)
    with bc.labelled(L.Trainer, "save_checkpoint", CKPT):
        bc.run_lightning(task.model, task.train_set, task.val_set, b.device, epochs=epochs + 1 - warmup,
                         warmup_epochs=warmup, batch_size=b.p["batch"], precision=precision, seed=b.seed,
                         peer=dict(bc.SAME_DATA_PEER, val_every=epochs, evaluate=task.evaluate_fn),
                         callbacks=[Hooks()])  # fmt: skip


# ------------------------------------------------------------------------------------------ the summary
def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    end = -math.inf
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _cause(g0: float, g1: float, over: list[dict[str, Any]], sync_ends: list[float], epoch_ends: list[float]) -> str:
    """The likely cause of the device idling over [g0, g1], from the host events `over` that overlap it."""
    names = {e["name"] for e in over}
    if CKPT in names or VAL in names:
        return "checkpoint" if CKPT in names else "validation"
    if any("DataLoader" in n for n in names):
        return "data"
    # a read or synchronize that ended just before or inside the gap: the queue drained while the host waited
    if bisect.bisect_right(sync_ends, g1) > bisect.bisect_left(sync_ends, g0 - 20):
        return "sync"
    if any(n.startswith(("cudaMalloc", "cudaFree", "cudaHostAlloc")) for n in names):
        return "allocator"
    return "epoch end" if bisect.bisect_right(epoch_ends, g1) > bisect.bisect_left(epoch_ends, g0) else "host launches"


def summarise_trace(trace: dict[str, Any], min_gap_us: float = 20.0) -> dict[str, Any]:
    """Busy time per step and every idle gap of the device with its likely cause, from a Chrome trace."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e and "dur" in e]
    marks = sorted(e["ts"] for e in ev if e["name"] == STEP)
    epoch_ends = sorted(e["ts"] for e in ev if e["name"] == EPOCH)
    if len(marks) < 2:
        raise ValueError("the trace holds fewer than two step marks: nothing to summarise")
    device = [e for e in ev if e.get("cat") in DEVICE_CATS]
    on = "cuda" if device else "cpu"
    launch = {e["args"]["correlation"]: e["ts"] for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}  # fmt: skip
    host = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "python_function")]
    if not device:  # a CPU run: the outermost operators of the thread that marks the steps are the "device"
        tid = next(e["tid"] for e in ev if e["name"] == STEP)
        device = _outermost([e for e in ev if e.get("cat") == "cpu_op" and e["tid"] == tid])
        ids = {id(e) for e in device}
        host = [e for e in host if id(e) not in ids]
    lo, hi = marks[0], marks[-1]
    busy = [0.0] * (len(marks) - 1)
    for e in device:  # by the step that launched it
        k = bisect.bisect_right(marks, launch.get(e.get("args", {}).get("correlation"), e["ts"])) - 1
        if 0 <= k < len(busy):
            busy[k] += e["dur"]
    sync_ends = sorted(e["ts"] + e["dur"] for e in host if any(x in e["name"] for x in _SYNC))
    host.sort(key=lambda e: e["ts"])
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in device if e["ts"] + e["dur"] > lo and e["ts"] < hi)
    gaps: list[dict[str, Any]] = []
    active: list[tuple[float, int]] = []  # (end, index into host) of the host events begun so far, by end
    nxt, end = 0, lo
    for s0, f in spans + [(hi, hi)]:
        if s0 - end >= min_gap_us:  # gaps come in time order: one sweep over the host events
            while nxt < len(host) and host[nxt]["ts"] < s0:
                heapq.heappush(active, (host[nxt]["ts"] + host[nxt]["dur"], nxt))
                nxt += 1
            while active and active[0][0] <= end:
                heapq.heappop(active)
            over = [host[i] for _, i in active]
            names = [e["name"] for e in over if e["name"] not in (STEP, EPOCH)]
            top = sorted(set(names), key=names.count, reverse=True)[:5]
            gaps.append({"start_us": end - lo, "us": s0 - end, "cause": _cause(end, s0, over, sync_ends, epoch_ends),
                         "host": top})  # fmt: skip
        end = max(end, f)
    by: dict[str, list[float]] = defaultdict(list)
    for g in gaps:
        by[g["cause"]].append(g["us"])
    steps = len(marks) - 1
    return {
        "device": on, "steps": steps,
        "epoch_ends": bisect.bisect_right(epoch_ends, hi) - bisect.bisect_left(epoch_ends, lo),
        "window_ms": (hi - lo) / 1e3, "step_ms": bc.stats([(b - a) / 1e3 for a, b in zip(marks, marks[1:])]),
        "busy_ms_per_step": bc.stats([v / 1e3 for v in busy]), "busy_frac": sum(busy) / (hi - lo),
        "idle_frac": sum(g["us"] for g in gaps) / (hi - lo), "min_gap_us": min_gap_us,
        "by_cause": {c: {"gaps": len(v), "ms": sum(v) / 1e3, "ms_per_step": sum(v) / 1e3 / steps,
                         "largest_ms": max(v) / 1e3} for c in CAUSES if (v := by.get(c))},
        "gaps": gaps,
    }  # fmt: skip


def render(result: dict[str, Any]) -> str:
    env, fmt = result["environment"], bc.fmt
    head = (f"Device idle gaps, **{result['preset']}** preset on {env['device_name']} ({env['device']}), torch "
            f"{env['torch']}, commit `{env['commit'][:12]}`. Busy = the device computing (on a CPU: the outermost "
            f"operators); gaps of at least {result['min_gap_us']:g} µs, each given its likely cause.")  # fmt: skip
    rows = [[name, s["steps"], s["epoch_ends"], fmt(s["step_ms"]["median"], ".2f"),
             fmt(s["busy_ms_per_step"]["median"], ".2f"), fmt(100 * s["busy_frac"], ".0f", "%"),
             fmt(100 * s["idle_frac"], ".0f", "%")] for name, s in result["loops"].items()]  # fmt: skip
    t1 = bc.md_table(["loop", "steps", "epoch ends", "step ms (median)", "busy ms/step (median)", "busy", "idle"], rows)
    rows = [[name, c, d["gaps"], fmt(d["ms_per_step"], ".3f"), fmt(d["largest_ms"], ".3f"),
             ", ".join(next((g["host"][:3] for g in s["gaps"] if g["cause"] == c), []))]
            for name, s in result["loops"].items() for c, d in s["by_cause"].items()]  # fmt: skip
    t2 = bc.md_table(["loop", "cause", "gaps", "idle ms per step", "largest ms", "host work in the first such gap"],
                     rows)  # fmt: skip
    return f"{head}\n\n{t1}\n\n{t2}\n" + "".join(f"\n- {n}" for n in result["notes"]) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = bc.parser(__doc__, FLAGS)
    a = ap.parse_args(argv)
    loops = [x for x in a.loops.split(",") if x]
    if a.steps < 1 or a.warmup_epochs < 1 or a.min_gap_us <= 0 or set(loops) - {"plainloop", "lightning_data"}:
        ap.error("need --steps >= 1, --warmup-epochs >= 1, --min-gap-us > 0, --loops from plainloop,lightning_data")
    device, notes = bc.device_of(a.device), []
    if "lightning_data" in loops and bc.lightning_available() is None:
        loops.remove("lightning_data")
        notes.append("lightning is not installed: its trace is skipped (pip install lightning)")
    p = dict(PRESETS[a.preset])
    cache_dir, data = prepare_data(a.cache_dir, p)
    b = Bench(data, p, cache_dir, device, 0)
    per_epoch = len(_build_task(b, None).train_set) // p["batch"]
    if per_epoch < 1:
        raise SystemExit(f"profile_gap: fewer training samples than one batch of {p['batch']}; use a larger preset")
    n_ep = max(1, math.ceil(a.steps / per_epoch))
    notes.append(f"{per_epoch} steps per epoch, batch {p['batch']}; traced epochs {a.warmup_epochs + 1}.."
                 f"{a.warmup_epochs + n_ep} (the last validates) and the next epoch's first step")  # fmt: skip
    out_loops = {}
    with tempfile.TemporaryDirectory() as tmp:
        for loop in loops:
            w, path = Window(device, a.warmup_epochs, a.warmup_epochs + n_ep - 1), Path(tmp) / f"{loop}.json"
            with bc.quiet():  # the loops' own console lines; the profile is what this prints
                (trace_plainloop if loop == "plainloop" else trace_lightning)(b, w, a.warmup_epochs + n_ep)
            w.stop()
            w.prof.export_chrome_trace(str(path))
            out_loops[loop] = summarise_trace(json.loads(path.read_text()), a.min_gap_us)
            print(f"[gap] traced {loop}", flush=True)
    result = {"schema": "plainloop-bench-profile-gap-1", "preset": a.preset, "command": bc.command("profile_gap", argv),
              "environment": bc.environment(device), "config": vars(a), "min_gap_us": a.min_gap_us,
              "loops": out_loops, "notes": notes}  # fmt: skip
    name = "cpu" if device.type == "cpu" else torch.cuda.get_device_name(device).split()[-1].lower()
    bc.write_result(Path(a.out) if a.out else bc.RESULTS_DIR / f"profile_gap_{name}.json", result, render(result))
    return result


if __name__ == "__main__":
    main()
