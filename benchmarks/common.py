"""Shared benchmark helpers: environment record, statistics, JSON output, Markdown tables, matmul peak.

Every harness under benchmarks/ writes one JSON file with `environment()` (device, driver, torch version,
git commit) beside its config and every repetition, and prints a Markdown table rendered by `md_table`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.sizes import CPU_MODEL, TINY_MODEL
from tasks.era5 import SEED_PRESET
from utils.performance_monitor import usable_cpus

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The RecursiveAttentionTransformer sizes of the benchmark configurations; "seed" is seed 000's model (the CLI's
# seed preset without its grid and context).
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": TINY_MODEL,
    "cpu": CPU_MODEL,
    "seed": {k: v for k, v in SEED_PRESET.items() if k not in ("resolution", "seq_len")},
}


def git_commit() -> str:
    """HEAD's hash (+"+dirty" when the tree has changes outside benchmarks/results), or "uncommitted" outside a
    git checkout."""
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=root)
        if out.returncode != 0:
            return "uncommitted"
        # result files are outputs: a run that follows another one's freshly written JSON is still clean
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)benchmarks/results"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=root,
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "uncommitted"


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


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
            mod = __import__(name)
            out[name] = str(getattr(mod, "__version__", "present"))
        except Exception:  # a broken optional install counts as missing
            out[name] = None
    return out


def environment(device: torch.device) -> dict[str, Any]:
    """Where the figures come from: machine, device, driver, library versions and the code's commit."""
    cpus = usable_cpus()
    env: dict[str, Any] = {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": _cpu_model(),
        "cpu_count": cpus,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model(),
        "driver": _driver_version() if device.type == "cuda" else None,
        "commit": git_commit(),
        "modules": optional_modules(),
        "loadavg": loadavg(),
    }
    return env


def loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS has none): recorded beside every timing."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def wait_for_quiet(max_load: float, max_wait_s: float, poll_s: float = 60.0) -> dict[str, Any]:
    """Wait until the 1-minute load average is below `max_load`, at most `max_wait_s` seconds.

    Timings on a shared machine are only worth committing when it is quiet; this says how long it waited
    and what the load was when it stopped waiting (quiet or not)."""
    t0 = time.monotonic()
    while True:
        la = loadavg()
        waited = time.monotonic() - t0
        if la is None or la[0] < max_load or waited >= max_wait_s:
            quiet = la is None or la[0] < max_load
            if not quiet:
                print(f"[bench] load average {la[0]:.2f} still >= {max_load} after {waited:.0f} s; going on")
            return {"max_load": max_load, "waited_s": round(waited, 1), "loadavg": la, "quiet": quiet}
        print(f"[bench] load average {la[0]:.2f} >= {max_load}: waiting ({waited:.0f} s so far)", flush=True)
        time.sleep(min(poll_s, max(1.0, max_wait_s - waited)))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: sync point (timing boundary)


def matmul_peak_flops(
    device: torch.device, dtype: torch.dtype | None = None, n: int | None = None, iters: int | None = None
) -> dict[str, Any]:
    """Measured dense matmul peak (FLOP/s) on `device`: bf16 on CUDA, fp32 on CPU (the precision each runs).

    The best of several timed batches of n x n products, so the figure is what this device really reaches
    today, not a datasheet number.
    """
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    if iters is None:
        iters = 20 if device.type == "cuda" else 4
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
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
    return {
        "flops": flops,
        "tflops": flops / 1e12,
        "dtype": str(dtype).replace("torch.", ""),
        "n": n,
        "iters": iters,
    }


def stats(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repetitions: min, max and the relative spread (max - min) / median."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("stats: no values (did every repetition fail?)")
    med = statistics.median(vals)
    return {
        "median": med,
        "min": min(vals),
        "max": max(vals),
        "spread": (max(vals) - min(vals)) / med if med else 0.0,
        "n": len(vals),
    }


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomic write, so a crash never leaves half a result file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p


def write_result(out: str | os.PathLike, result: Any, md: str) -> Path:
    """The raw JSON and its rendered Markdown table side by side (out and out.md); the table is printed."""
    out = write_json(out, result)
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)
    return out


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:{spec}}{suffix}"


def all_figures_finite(obj: Any, path: str = "") -> list[str]:
    """Paths of numbers in `obj` that are not finite (for tests and a final self-check)."""
    bad: list[str] = []
    if isinstance(obj, bool):
        return bad
    if isinstance(obj, int | float):
        if not math.isfinite(obj):
            bad.append(path)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            bad += all_figures_finite(v, f"{path}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            bad += all_figures_finite(v, f"{path}[{i}]")
    return bad
