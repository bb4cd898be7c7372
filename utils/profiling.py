"""`--profile`: a torch.profiler trace of a few training steps, plus a top-ops table and per-step counts.

The trainer passes `step_fn` (one full training step: fetch batch, forward, backward, optimizer step).
Outputs in `out_dir` (the CLI passes RUN_DIR/profile): `trace.json` (open in chrome://tracing or
https://ui.perfetto.dev) and `profile_top_ops.md`. The returned counts (kernels and syncs per step, share of
device time in elementwise ops) feed utils/bottleneck.py's `diagnose(..., step_stats=...)`.

Nothing is printed. The profiler's native library (kineto) writes progress lines such as
`USDT:... profiler_start` and `STAGE:... Completed Stage: Warm Up` straight to file descriptors 1 and 2,
below Python, and its log-level variable (KINETO_LOG_LEVEL) is read only once per process. So while the
profiler starts, steps and stops, fds 1 and 2 go to a temporary file; the progress lines are dropped and
anything else (a kineto warning, a Python warning) is returned in "messages" and written to the table.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

__all__ = ["profile_steps"]

# Host-side calls that wait for the GPU. `.item()` shows up as cudaMemcpyAsync + cudaStreamSynchronize.
_SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
# Ops limited by memory bandwidth rather than arithmetic (a heuristic on the op/kernel name).
_ELEMENTWISE_HINTS = (
    "elementwise", "vectorized", "reduce", "norm", "copy", "add", "mul", "div", "gelu", "relu", "silu",
    "softmax", "dropout", "fill", "where", "cat", "index", "sum", "mean", "pow", "sqrt", "exp",
)  # fmt: skip
_COMPUTE_HINTS = ("gemm", "matmul", "mm", "conv", "sm80", "sm90", "cutlass", "flash", "attention", "bmm")


def _is_compute(name: str) -> bool:
    n = name.lower()
    return any(h in n for h in _COMPUTE_HINTS)


def _is_elementwise(name: str) -> bool:
    n = name.lower()
    return not _is_compute(n) and any(h in n for h in _ELEMENTWISE_HINTS)


def _inside_aten(evt: Any) -> bool:
    p = evt.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False


# kineto's progress lines: "<LEVEL>:<date> <time> <pid>:<tid> <file>:<line>] <message>"
_KINETO_PROGRESS = re.compile(r"^(STAGE|USDT|INFO|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] ")


@contextlib.contextmanager
def _native_output_to(messages: list[str]) -> Iterator[None]:
    """Redirect fds 1 and 2 (and Python warnings) for the duration; keep what is not kineto progress."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no usable fds (a detached process): nothing to redirect
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        messages.extend(f"{w.category.__name__}: {w.message}" for w in caught)
        return
    with tempfile.TemporaryFile() as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
        messages.extend(line for line in text.splitlines() if line.strip() and not _KINETO_PROGRESS.match(line))
        messages.extend(f"{w.category.__name__}: {w.message}" for w in caught)


def profile_steps(
    step_fn: Callable[[], None],
    out_dir: Path,
    steps: int = 5,
    warmup: int = 2,
    row_limit: int = 25,
) -> dict[str, Any]:
    """Profile `steps` calls of `step_fn` after `warmup` unrecorded ones; print nothing.

    Returns {"trace", "table", "steps", "device", "kernels_per_step", "syncs_per_step",
    "elementwise_frac", "top_ops": [{"name", "calls", "self_time_ms", "share"}...], "messages": [str]}.
    On a CPU-only run "kernels_per_step" counts top-level aten operator calls instead of GPU kernels.
    "messages" holds what the profiler wrote besides its progress lines (warnings; usually empty): the
    caller decides whether to show it. Output of `step_fn` itself is left alone.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"profile_steps(steps={steps!r}): need an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"profile_steps(warmup={warmup!r}): need an integer >= 0")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"profile_steps(out_dir={str(out_dir)!r}): exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    messages: list[str] = []
    # Only the profiler's own calls are wrapped (set-up, start, step boundaries, stop): the training step runs
    # with the console untouched, so its errors and prints still show.
    with _native_output_to(messages):
        sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1)  # warns when warmup=0
        prof = profile(activities=activities, schedule=sched, record_shapes=False)
        prof.__enter__()
    try:
        for _ in range(warmup + steps):
            step_fn()
            if cuda:
                torch.cuda.synchronize()  # deliberate sync: the step's kernels belong to this step's window
            with _native_output_to(messages):
                prof.step()
    finally:
        with _native_output_to(messages):
            prof.__exit__(None, None, None)
    trace = out_dir / "trace.json"
    with _native_output_to(messages):
        prof.export_chrome_trace(str(trace))

    events = prof.events()
    device_kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    syncs = sum(1 for e in events if e.name in _SYNC_NAMES)
    if cuda and device_kernels:
        kernels = len(device_kernels)
        dev_total = sum(e.self_device_time_total for e in device_kernels) or 1.0
        ew = sum(e.self_device_time_total for e in device_kernels if _is_elementwise(e.name)) / dev_total
    else:
        # CPU: count operator calls that are not nested in another aten op (what Python dispatched).
        kernels = sum(1 for e in events if e.name.startswith("aten::") and not _inside_aten(e))
        ew = None

    sort_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    table_txt = averages.table(sort_by=sort_key, row_limit=row_limit)
    rows = []
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    tot = sum(getattr(a, attr, 0.0) for a in averages if not a.key.startswith("ProfilerStep")) or 1.0
    ops = [a for a in averages if not a.key.startswith("ProfilerStep")]  # the step marker is not an op
    for a in sorted(ops, key=lambda a: getattr(a, attr, 0.0), reverse=True)[:row_limit]:
        t = getattr(a, attr, 0.0)
        rows.append({"name": a.key, "calls": a.count, "self_time_ms": t / 1000.0, "share": t / tot})
    table = out_dir / "profile_top_ops.md"
    lines = [
        f"# Profile: {steps} steps after {warmup} warm-up steps ({'CPU + CUDA' if cuda else 'CPU'})",
        "",
        f"Chrome trace: `{trace.name}` (open in https://ui.perfetto.dev or chrome://tracing).",
        "",
        f"- {'GPU kernels' if cuda else 'top-level operator calls'} per step: {kernels / steps:.0f}",
        f"- host-device syncs per step: {syncs / steps:.1f}",
    ]
    if ew is not None:
        lines.append(f"- share of GPU time in elementwise/normalisation/copy kernels: {100 * ew:.0f}%")
    lines += ["", "| op | calls | self time (ms) | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['name']}` | {r['calls']} | {r['self_time_ms']:.2f} | {100 * r['share']:.1f}% |" for r in rows]
    if messages:
        lines += ["", "Profiler messages:", "", "```", *messages, "```"]
    lines += ["", "Full torch.profiler table:", "", "```", table_txt, "```", ""]
    table.write_text("\n".join(lines), encoding="utf-8")
    return {
        "trace": str(trace),
        "table": str(table),
        "steps": steps,
        "device": "cuda" if cuda else "cpu",
        "kernels_per_step": kernels / steps,
        "syncs_per_step": syncs / steps,
        "elementwise_frac": ew,
        "top_ops": rows,
        "messages": messages,
    }
