"""Seed 003's "system resources and training speed" report, built from measurements instead of guesses.

    python -m utils.system_report            # hardware only (Markdown)
    python -m utils.system_report --json     # the same as JSON
    python train_optimized.py --system_report [flags]   # full report: the trainer supplies run_trial

The full report (`run_system_report`) runs the user's configuration for a few steps, diagnoses the
bottleneck (utils/bottleneck.py), measures the candidate settings relevant to that verdict in the same
process, interleaved `repeats` times, and writes a Markdown page: verdict, a priority list of what to
change first with the measured gain of each, the configured job projected in hours, kWh and cost, the
before/after table, utilisation (NVML kernel-busy and memory-controller %, where a GPU is present) and
hardware with base and current clocks. A difference counts only when it is larger than the spread of the
repetitions (the ranges of the two settings' samples/s do not overlap); anything else is reported as "no
difference", and with one repetition nothing is judged. Ground floor: the trainer hands in
`run_trial(overrides, steps) -> dict`; nothing here imports it. Trial folders (`trial_dir`) are removed
when the report is written.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from utils.performance_monitor import _NvmlBackend, usable_cpus

try:
    from utils.bottleneck import THRESHOLDS, diagnose
except ImportError:  # copied next to bottleneck.py in another repo
    from bottleneck import THRESHOLDS, diagnose  # type: ignore[no-redef]

__all__ = ["hardware_info", "render_hardware", "render_report", "run_system_report", "RELEVANT_KEYS", "judge",
           "project_job", "remove_trial_dir"]  # fmt: skip

_GB = 1024.0**3

# Which setting names can help which bottleneck; used to pick the candidates worth measuring.
RELEVANT_KEYS: dict[str, set[str]] = {
    "data-loading bound": {
        "num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "cache", "cache_dataset",
        "dataset_on_device", "device_cache", "gpu_dataset", "preload",
    },
    "host/launch bound": {
        "batch_size", "compile", "compile_model", "compile_mode", "cuda_graphs", "log_every", "norm_every", "accumulate_grad_batches",
    },
    "compute bound": {"precision", "amp", "bf16", "tf32", "compile", "compile_model", "compile_mode", "channels_last", "fused_optimizer"},
    "memory bound": {
        "precision", "amp", "bf16", "activation_checkpointing", "use_gradient_checkpointing", "batch_size", "accumulate_grad_batches", "compile",
        "compile_model",
    },
}  # fmt: skip


# --------------------------------------------------------------------------- hardware
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run(
                [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


def cpu_frequencies(model: str | None = None) -> dict[str, float | None]:
    """{"cpu_base_mhz", "cpu_current_mhz", "cpu_max_mhz"}: psutil's cpu_freq (current, max) and the base
    (nominal) frequency from cpufreq's base_frequency, else the "@ 2.50GHz" of the model name."""
    out: dict[str, float | None] = {"cpu_base_mhz": None, "cpu_current_mhz": None, "cpu_max_mhz": None}
    try:
        f = psutil.cpu_freq()
        if f:
            out["cpu_current_mhz"] = round(f.current, 1) if f.current else None
            out["cpu_max_mhz"] = round(f.max, 1) if f.max else None
    except Exception:  # not every platform has a frequency interface
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/base_frequency", encoding="utf-8") as fh:
            out["cpu_base_mhz"] = int(fh.read().strip()) / 1000.0  # kHz
    except (OSError, ValueError):
        m = re.search(r"@\s*([0-9.]+)\s*GHz", model or "")
        if m:
            out["cpu_base_mhz"] = float(m.group(1)) * 1000.0
    return out


def _nvml() -> Any:
    """The pynvml module, initialised, or None (not installed, no driver, no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def nvml_clocks() -> list[dict[str, Any]]:
    """Per GPU (NVML index order): SM and memory clocks now, their maxima and the default application
    (base) SM clock, in MHz; [] without NVML."""
    nv = _nvml()
    if nv is None:
        return []
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            row: dict[str, Any] = {"index": i}
            for key, fn, clk in (
                ("sm_clock_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
                ("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
                ("sm_clock_base_mhz", "nvmlDeviceGetDefaultApplicationsClock", "NVML_CLOCK_SM"),
                ("mem_clock_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
                ("mem_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
            ):
                try:
                    row[key] = int(getattr(nv, fn)(h, getattr(nv, clk)))
                except Exception:  # not supported on this board / driver
                    row[key] = None
            out.append(row)
    except Exception:
        pass
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out


def hardware_info() -> dict[str, Any]:
    """CPU, RAM, GPUs, driver, CUDA/cuDNN and library versions, OS, clocks. Cheap (well under a second)."""
    usable = usable_cpus()
    vm = psutil.virtual_memory()
    model = _cpu_model()
    info: dict[str, Any] = {
        "cpu_model": model,
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_usable_cores": usable,
        **cpu_frequencies(model),
        "ram_total_gb": round(vm.total / _GB, 1),
        "ram_available_gb": round(vm.available / _GB, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "gpus": [],
        "gpu_driver": None,
        "cuda": None,
        "cudnn": None,
        "torch": None,
        "torch_threads": None,
    }
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["cudnn"] = torch.backends.cudnn.version()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_gb": round(p.total_memory / _GB, 1),
                    "capability": f"{p.major}.{p.minor}",
                    "multiprocessors": p.multi_processor_count,
                }
            )
        info["gpu_driver"] = _driver_version()
        clocks = nvml_clocks()
        if len(clocks) == len(info["gpus"]):  # NVML order can differ from CUDA's; equal counts make it safe enough
            for g in info["gpus"]:
                g.update({k: v for k, v in clocks[g["index"]].items() if k != "index"})
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info["gpus"].append({"index": 0, "name": "Apple MPS", "memory_gb": None, "capability": None})
    return info


def render_hardware(hw: dict[str, Any]) -> str:
    """The hardware section as a Markdown table."""
    cores = f"{hw.get('cpu_physical_cores')} physical / {hw.get('cpu_logical_cores')} logical"
    if hw.get("cpu_usable_cores") not in (None, hw.get("cpu_logical_cores")):
        cores += f" ({hw['cpu_usable_cores']} usable by this process)"
    freqs = [f"{label} {hw[k]:.0f} MHz" for label, k in (("base", "cpu_base_mhz"), ("now", "cpu_current_mhz"),
             ("max", "cpu_max_mhz")) if hw.get(k)]  # fmt: skip
    rows = [
        ("CPU", hw.get("cpu_model")),
        ("CPU cores", cores),
        ("CPU frequency", ", ".join(freqs) or "not reported"),
        ("RAM", f"{hw.get('ram_total_gb')} GB ({hw.get('ram_available_gb')} GB available)"),
    ]
    gpus = hw.get("gpus") or []
    if gpus:
        for g in gpus:
            mem = f", {g['memory_gb']} GB" if g.get("memory_gb") else ""
            cap = f", compute capability {g['capability']}" if g.get("capability") else ""
            rows.append((f"GPU {g.get('index', 0)}", f"{g.get('name')}{mem}{cap}"))
            clk = [f"{label} {g[k]} MHz" for label, k in (("SM base", "sm_clock_base_mhz"), ("SM now", "sm_clock_mhz"),
                   ("SM max", "sm_clock_max_mhz"), ("memory now", "mem_clock_mhz"),
                   ("memory max", "mem_clock_max_mhz")) if g.get(k)]  # fmt: skip
            if clk:
                rows.append((f"GPU {g.get('index', 0)} clocks (NVML)", ", ".join(clk)))
        rows.append(("GPU driver", hw.get("gpu_driver") or "n/a"))
        rows.append(("CUDA (torch build) / cuDNN", f"{hw.get('cuda') or 'n/a'} / {hw.get('cudnn') or 'n/a'}"))
    else:
        rows.append(("GPU", "none visible to torch (CPU-only run)"))
    rows += [
        ("torch", f"{hw.get('torch')} ({hw.get('torch_threads')} intra-op threads)"),
        ("Python / OS", f"{hw.get('python')} / {hw.get('os')}"),
    ]
    lines = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- measuring around a trial
def _rapl_uj() -> tuple[float, float] | None:
    """(energy µJ summed over the CPU packages, wrap range µJ) from Linux RAPL, or None where not readable
    (no powercap, or not permitted: many systems restrict energy_uj to root)."""
    total = rng = 0.0
    found = False
    for d in glob.glob("/sys/class/powercap/intel-rapl:[0-9]*"):
        if d.count(":") != 1:  # sub-domains (core, uncore, dram) are inside the package figure
            continue
        try:
            with open(os.path.join(d, "energy_uj"), encoding="utf-8") as f:
                total += float(f.read())
            with open(os.path.join(d, "max_energy_range_uj"), encoding="utf-8") as f:
                rng += float(f.read())
            found = True
        except (OSError, ValueError):
            return None
    return (total, rng) if found else None


class _NvmlUtilSampler:
    """Samples NVML utilisation of the training GPU in a thread, through the monitor's NVML reader
    (`_NvmlBackend.utilization`): kernel-busy %, memory-controller % and this process's SM %."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.backend: _NvmlBackend | None = None
        try:
            import torch

            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        except Exception:
            index = 0
        try:
            self.backend = _NvmlBackend(index)  # matches CUDA's device by PCI bus id
        except Exception:  # no NVML, no driver, no GPU
            self.backend = None
        self.rows: list[tuple[float | None, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        assert self.backend is not None
        while not self._stop.wait(self.interval):
            self.rows.append(self.backend.utilization())

    def start(self) -> _NvmlUtilSampler:
        if self.backend is not None:
            self._thread = threading.Thread(target=self._sample, name="report-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> dict[str, float | None] | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        if self.backend is not None:
            self.backend.close()

        def mean(j: int) -> float | None:
            vals = [v for v in (r[j] for r in self.rows) if v is not None]
            return sum(vals) / len(vals) if vals else None

        return {"gpu_busy_pct": mean(0), "mem_ctrl_pct": mean(1), "process_sm_pct": mean(2),
                "util_samples": len(self.rows)}  # fmt: skip


def _measured_trial(run_trial: Callable[[dict, int], dict], overrides: dict, steps: int) -> dict[str, Any]:
    """run_trial plus what the report measures around it: wall time, CPU package power (RAPL) and NVML
    utilisation. A trial's own "monitor" summary gives the GPU's board power."""
    e0, t0 = _rapl_uj(), time.perf_counter()
    util = _NvmlUtilSampler().start()
    try:
        m = run_trial(overrides, steps)
    finally:
        nv = util.stop()
    if not isinstance(m, dict):
        raise TypeError(f"run_trial must return a dict of measurements, got {type(m)}")
    m = dict(m)
    wall = time.perf_counter() - t0
    e1 = _rapl_uj()
    if e0 is not None and e1 is not None and wall > 0:
        d = e1[0] - e0[0]
        if d < 0:  # the counter wrapped
            d += e1[1]
        m.setdefault("cpu_package_w", d / 1e6 / wall)
    if nv:
        m.setdefault("nvml", nv)
    m.setdefault("trial_wall_s", wall)
    return m


# --------------------------------------------------------------------------- judging and projecting
def judge(base_reps: list[float | None], cand_reps: list[float | None]) -> str:
    """ "faster", "slower", "no difference" (the two settings' samples/s ranges overlap: the difference
    is inside the measured noise), or "not judged" (fewer than 2 repetitions of either: no noise estimate)."""
    b = [v for v in base_reps if v is not None]
    c = [v for v in cand_reps if v is not None]
    if len(b) < 2 or len(c) < 2:
        return "not judged"
    if min(c) > max(b):
        return "faster"
    if max(c) < min(b):
        return "slower"
    return "no difference"


def project_job(
    samples_per_s: float | None,
    job_samples: float | None,
    power_w: float | None = None,
    price_per_kwh: float | None = None,
    price_per_gpu_hour: float | None = None,
    gpus: int = 1,
) -> dict[str, float | None]:
    """Hours, kWh and cost of a job of `job_samples` training samples at `samples_per_s`.

    kWh = power_w x hours (None without a power figure); cost = hours x gpus x price_per_gpu_hour +
    kWh x price_per_kwh, each part only when its price is given (None when neither can be computed).
    """
    if not samples_per_s or not job_samples:
        return {"hours": None, "kwh": None, "cost": None}
    hours = job_samples / samples_per_s / 3600.0
    kwh = power_w * hours / 1000.0 if power_w else None
    parts = []
    if price_per_gpu_hour is not None:
        parts.append(hours * max(gpus, 1) * price_per_gpu_hour)
    if price_per_kwh is not None and kwh is not None:
        parts.append(kwh * price_per_kwh)
    return {"hours": hours, "kwh": kwh, "cost": sum(parts) if parts else None}


def remove_trial_dir(trial_dir: str | os.PathLike | None) -> bool:
    """Delete the report's trial folder (run directories, checkpoints, metrics of the trials). True if
    something was removed."""
    if trial_dir is None:
        return False
    p = Path(trial_dir)
    if not p.exists():
        return False
    shutil.rmtree(p)
    return True


# --------------------------------------------------------------------------- report
def _duration(hours: float) -> str:
    """6.67 h; a job under 0.1 h in minutes or seconds (0.00 h instead of 0.00 h said nothing)."""
    if hours >= 0.1:
        return f"{hours:.2f} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.1f} s"


def _f(v: Any, spec: str = ".1f", suffix: str = "") -> str:
    if v is None:
        return "n/a"
    try:
        return f"{v:{spec}}{suffix}"
    except (TypeError, ValueError):
        return str(v)


def _settings_str(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if d else "(as given)"


def _row_label(t: dict[str, Any], base: dict[str, Any]) -> str:
    """A trial's settings, once: "batch_size=64"; a named trial also by its name ("combined: a=1, b=2")."""
    if t is base:
        return str(t.get("name") or "your settings")
    changed = _settings_str(t.get("overrides") or {})
    name = str(t.get("name") or changed)
    return changed if name == changed else f"{name}: {changed}"


def _judged(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with "ratio" (median samples/s vs yours) and "judgement" against trials[0]."""
    base = trials[0]
    b_sps = base.get("samples_per_s")
    b_reps = base.get("samples_per_s_reps") or [b_sps]
    out = [dict(base, ratio=1.0)]
    for t in trials[1:]:
        t = dict(t)
        sps = t.get("samples_per_s")
        if not t.get("error"):
            t["ratio"] = sps / b_sps if sps and b_sps else None
            t.setdefault("judgement", judge(b_reps, t.get("samples_per_s_reps") or [sps]))
        out.append(t)
    return out


def _money(v: float | None, currency: str) -> str:
    return "n/a" if v is None else f"{v:,.2f} {currency}".strip()


def render_report(
    hardware: dict[str, Any],
    config: dict[str, Any],
    profile: dict[str, Any],
    verdict: dict[str, Any],
    trials: list[dict[str, Any]],
) -> str:
    """Markdown: verdict, what to change first (measured), the job projected, the before/after table, the
    run's measurements, hardware, config.

    `profile` is the monitor summary of the user's configuration (TrainingMonitor.get_summary()), optionally
    with "step_stats" and "nvml". `trials[0]` is the user's configuration; the others are compared with it
    (rows may carry "samples_per_s_reps", "power_w", "projection"). Projection settings come from `config`:
    job_samples, price_per_kwh, price_per_gpu_hour, currency.
    """
    title = config.get("title") or "plainloop system report: resources and training speed"
    out = [f"# {title}", ""]
    out.append(f"Generated {config.get('generated') or time.strftime('%Y-%m-%d %H:%M')}"
               + (f" by `{config['command']}`" if config.get("command") else "") + ".")  # fmt: skip
    if config.get("note"):
        out += ["", f"> {config['note']}"]
    out += [
        "",
        f"## Verdict: **{verdict.get('verdict')}** (confidence: {verdict.get('confidence', 'n/a')})",
        "",
    ]
    out += [f"What usually helps here (a rule of thumb, measured below where possible): {verdict.get('advice')}",
            "", "Evidence:"]  # fmt: skip
    out += [f"- {e}" for e in verdict.get("evidence", [])]
    for n in verdict.get("notes", []):
        out.append(f"- _Note:_ {n}")

    currency = str(config.get("currency") or "")
    if trials:
        rows = _judged(trials)
        base = rows[0]
        steps = config.get("steps_per_trial")
        b_reps = [v for v in (base.get("samples_per_s_reps") or []) if v is not None]
        noise = (
            f"yours ranged {min(b_reps):.1f}–{max(b_reps):.1f} samples/s over {len(b_reps)} timings "
            f"(±{50 * (max(b_reps) - min(b_reps)) / max(_median(b_reps), 1e-9):.0f}%)"
            if len(b_reps) > 1
            else "one run each: no noise estimate"
        )
        faster = sorted((t for t in rows[1:] if t.get("judgement") == "faster"), key=lambda t: -(t["ratio"] or 0))
        out += ["", "## What to change first, measured in this run", ""]
        if faster:
            for i, t in enumerate(faster, 1):
                pj, pb = t.get("projection") or {}, base.get("projection") or {}
                saves = ""
                if pj.get("hours") is not None and pb.get("hours") is not None:
                    saves = f"; the configured job: {_duration(pj['hours'])} instead of {_duration(pb['hours'])}"
                    if pj.get("cost") is not None and pb.get("cost") is not None:
                        saves += f", {_money(pj['cost'], currency)} instead of {_money(pb['cost'], currency)}"
                out.append(f"{i}. **{_settings_str(t.get('overrides') or {})}** — {t['ratio']:.2f}× your "
                           f"samples/s, beyond the spread of the repetitions{saves}")  # fmt: skip
            if any("batch_size" in (t.get("overrides") or {}) for t in faster):
                out += ["", "A different batch size changes the optimisation: rescale the learning rate "
                        "(--lr_scaling sqrt|linear) or keep the effective batch with gradient accumulation."]  # fmt: skip
        else:
            out.append("Nothing measured here was faster than your settings beyond the noise: keep them.")
        same = [t for t in rows[1:] if t.get("judgement") == "no difference"]
        slower = [t for t in rows[1:] if t.get("judgement") == "slower"]
        unjudged = [t for t in rows[1:] if t.get("judgement") == "not judged"]
        if same:
            out.append("- **No difference** (inside the noise: " + noise + "): "
                       + "; ".join(f"{_settings_str(t.get('overrides') or {})} ({t['ratio']:.2f}×)" for t in same
                                   if t.get("ratio")))  # fmt: skip
        if slower:
            out.append("- Slower: " + "; ".join(f"{_settings_str(t.get('overrides') or {})} ({t['ratio']:.2f}×)"
                                                for t in slower if t.get("ratio")))  # fmt: skip
        if unjudged:
            out.append(f"- **Not judged** ({noise}; run with --report_repeats 3 or more): "
                       + "; ".join(f"{_settings_str(t.get('overrides') or {})} ({_f(t.get('ratio'), '.2f', '×')})"
                                   for t in unjudged))  # fmt: skip

        if config.get("job_samples"):
            out += [
                "",
                f"## The configured job, projected ({config['job_samples']:,.0f} training samples)",
                "",
            ]
            out += [
                "| settings | samples/s | hours | power (W) | energy (kWh) | cost |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for t in [base, *faster]:
                pj = t.get("projection") or {}
                label = "your settings" if t is base else _settings_str(t.get("overrides") or {})
                out.append(f"| {label} | {_f(t.get('samples_per_s'))} | {_f(pj.get('hours'), '.2g' if (pj.get('hours') or 1) < 0.1 else '.2f')} | "
                           f"{_f(t.get('power_w'), '.0f')} | {_f(pj.get('kwh'), '.3f')} | "
                           f"{_money(pj.get('cost'), currency)} |")  # fmt: skip
            src = base.get("power_source")
            cur = f" {currency}" if currency else ""
            unit = "GPU" if hardware.get("gpus") else "machine"
            out.append("")
            out.append(
                "Hours = samples ÷ measured samples/s (training steps only: add validation and start-up). "
                f"Power: {src or 'not measured on this machine (no NVML, no readable RAPL): pass --power_w (run_system_report(power_w=...)) to get kWh'}. "
                f"Prices: {_f(config.get('price_per_kwh'), '.3g')}{cur} per kWh, "
                f"{_f(config.get('price_per_gpu_hour'), '.3g')}{cur} per {unit} hour."
            )

        # the counts a reader checks against the table: its rows, and how often each was timed
        counts = sorted({len([v for v in t.get("samples_per_s_reps") or [] if v is not None]) or 1
                         for t in rows if not t.get("error")})  # fmt: skip
        timed = (str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}") if counts else "1"
        what = f"the {len(rows)} settings below" if len(rows) > 1 else "your settings"
        how = (
            f" ({what}, {steps} steps a run"
            + (f"; each timed {timed} times, interleaved: the median and its range" if timed != "1" else "")
            + ")"
            if steps
            else ""
        )
        out += ["", "## Before / after" + how, ""]
        out += [
            "| settings | samples/s | vs yours | judged | step (ms) | data wait | peak mem (MB) |",
            "|---|---:|---:|---|---:|---:|---:|",
        ]
        for t in rows:
            if t.get("error"):
                out.append(f"| {_row_label(t, base)} | failed: {t['error']} | | | | | |")
                continue
            sps = t.get("samples_per_s")
            dw = t.get("data_wait_frac")
            mine = t is base
            out.append(
                f"| {_row_label(t, base)} | "
                f"{_f(sps)}{_spread(t.get('samples_per_s_reps'))} | {_f(t.get('ratio'), '.2f', '×')} | "
                f"{'—' if mine else t.get('judgement', 'n/a')} | {_f(t.get('step_time_ms'))} | "
                f"{_f(None if dw is None else 100 * dw, '.0f', '%')} | {_f(t.get('peak_mem_mb'), '.0f')} |"
            )
        out.append("")
        out.append(
            "Throughput is samples per second (iterations per second hide the batch size). A setting counts as "
            "faster or slower only when its samples/s range over the repetitions does not overlap yours."
        )

    p = profile or {}
    it = p.get("iter_time_s") or {}
    out += ["", "## Your configuration, measured", ""]
    out.append(
        f"- step time p50 {_f(_ms(it.get('p50')))} ms, p90 {_f(_ms(it.get('p90')))} ms, p99 {_f(_ms(it.get('p99')))} ms "
        f"over {p.get('iterations', 'n/a')} steps; {_f(p.get('samples_per_s'))} samples/s"
    )
    dw = p.get("data_wait_frac")
    out.append(f"- waiting for data: {_f(None if dw is None else 100 * dw, '.0f', '%')} of step time")
    out.append(
        f"- CPU: {_f(p.get('cpu_percent_mean'), '.0f', '%')} of the machine; training process + loader workers "
        f"{_f(p.get('process_cpu_percent_mean'), '.0f', '%')} of one core; RAM in use up to "
        f"{_f(p.get('ram_used_gb_max'))} of {_f(p.get('ram_total_gb'))} GB"
    )
    if p.get("gpu_util_mean") is not None or p.get("peak_gpu_mem_mb") is not None:
        out.append(
            f"- GPU: utilisation {_f(p.get('gpu_util_mean'), '.0f', '%')}, power {_f(p.get('gpu_power_w_mean'), '.0f', ' W')}"
            f", peak allocated {_f(p.get('peak_gpu_mem_mb'), '.0f')} MB of {_f(p.get('gpu_mem_total_mb'), '.0f')} MB, "
            f"max temperature {_f(p.get('gpu_temp_c_max'), '.0f', ' °C')}, energy {_f(p.get('energy_kwh'), '.5f', ' kWh')}"
        )
    nv = p.get("nvml") or {}
    if nv:
        out.append(
            f"- NVML over the trial: kernels running {_f(nv.get('gpu_busy_pct'), '.0f', '%')} of the time (the "
            f"'sm' column of nvidia-smi dmon), memory controller busy {_f(nv.get('mem_ctrl_pct'), '.0f', '%')}, "
            f"this process's SM share {_f(nv.get('process_sm_pct'), '.0f', '%')} ({nv.get('util_samples', 0)} samples)"
        )
    elif not hardware.get("gpus"):
        out.append("- SM / memory-controller utilisation: no GPU (NVML reads them where one is present)")
    if p.get("cpu_package_w") is not None:
        out.append(f"- CPU package power (RAPL): {p['cpu_package_w']:.0f} W")
    ss = p.get("step_stats") or {}
    if ss.get("kernels_per_step") is not None:
        out.append(
            f"- profiler: {ss['kernels_per_step']:.0f} kernels/ops per step, {_f(ss.get('syncs_per_step'))} syncs per step"
        )
    cores, sys_pct, proc_pct = (
        p.get("cpu_count_logical"),
        p.get("cpu_percent_mean"),
        p.get("process_cpu_percent_mean"),
    )
    if cores and sys_pct is not None and proc_pct is not None:
        others = cores * sys_pct / 100 - proc_pct / 100
        if others >= 0.5:
            out.append(
                f"- **other processes kept about {others:.1f} of {cores} cores busy** during the measurement: "
                "timings are noisier and slower than on an idle machine"
            )
    ovh = p.get("sampler_overhead_frac")
    out.append(f"- the monitor itself used {_f(None if ovh is None else 100 * ovh, '.2f', '%')} of one core")
    if config.get("trial_dir_removed"):
        out.append(f"- trial folders removed after measuring ({config['trial_dir_removed']})")

    out += ["", "## Hardware", "", render_hardware(hardware)]
    hidden = ("title", "note", "generated", "command", "steps_per_trial", "repeats", "trial_dir_removed")
    shown = {k: v for k, v in config.items() if k not in hidden}
    if shown:
        out += ["", "## Configuration", "", "`" + _settings_str(shown) + "`"]
    out += [
        "",
        "<sub>Verdict rules: data-loading bound when ≥"
        f"{100 * THRESHOLDS['data_wait_frac']:.0f}% of step time waits for data; memory bound when peak memory ≥"
        f"{100 * THRESHOLDS['gpu_mem_frac']:.0f}% of the device; host/launch bound when GPU utilisation is under "
        f"{THRESHOLDS['gpu_util_idle']:.0f}% while not waiting for data; compute bound otherwise "
        "(utils/bottleneck.py).</sub>",
        "",
    ]
    return "\n".join(out)


def _spread(reps: list | None) -> str:
    vals = [v for v in (reps or []) if v is not None]
    return f" ({min(vals):.0f}–{max(vals):.0f})" if len(vals) > 1 else ""


def _ms(s: float | None) -> float | None:
    return None if s is None else 1000.0 * s


def _candidate(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if "overrides" in c:
        return str(c.get("name") or _settings_str(c["overrides"])), dict(c["overrides"])
    return _settings_str(c), dict(c)


def _median(xs: list[float]) -> float:
    srt = sorted(xs)
    n = len(srt)
    return srt[n // 2] if n % 2 else 0.5 * (srt[n // 2 - 1] + srt[n // 2])


def _trial_row(name: str, overrides: dict, base_settings: dict, runs: list[dict]) -> dict[str, Any]:
    """One table row from one or more repetitions: medians, plus every repetition's samples/s."""

    def val(m: dict, key: str, mon_key: str, conv: Callable[[Any], Any] = lambda v: v) -> Any:
        if m.get(key) is not None:
            return m[key]
        mon = m.get("monitor") or {}
        return conv(mon.get(mon_key)) if mon.get(mon_key) is not None else None

    def med(key: str, mon_key: str, conv: Callable[[Any], Any] = lambda v: v) -> float | None:
        vals = [v for v in (val(m, key, mon_key, conv) for m in runs) if v is not None]
        return _median(vals) if vals else None

    row: dict[str, Any] = {
        "name": name,
        "overrides": overrides,
        "settings": {**base_settings, **overrides},
        "samples_per_s": med("samples_per_s", "samples_per_s"),
        "data_wait_frac": med("data_wait_frac", "data_wait_frac"),
        "step_time_ms": med("step_time_ms", "iter_time_s", lambda it: _ms(it.get("p50"))),
        "peak_mem_mb": med("peak_mem_mb", "peak_gpu_mem_mb"),
        "gpu_power_w": med("gpu_power_w", "gpu_power_w_mean"),
        "cpu_package_w": med("cpu_package_w", "cpu_package_w"),
        "samples_per_s_reps": [val(m, "samples_per_s", "samples_per_s") for m in runs],
    }
    if runs and "monitor" in runs[0]:
        row["monitor"] = runs[0]["monitor"]
    return row


def _error_row(name: str, overrides: dict, base_settings: dict, err: BaseException) -> dict[str, Any]:
    first = str(err).splitlines()[0][:120] if str(err) else ""
    return {"name": name, "overrides": overrides, "settings": {**base_settings, **overrides},
            "error": f"{type(err).__name__}: {first}"}  # fmt: skip


def _power(row: dict[str, Any], assumed_w: float | None) -> tuple[float | None, str | None]:
    if row.get("gpu_power_w") is not None:  # the GPU board, from NVML, measured in the trial
        extra = row.get("cpu_package_w") or 0.0
        src = "NVML GPU board power" + (" + RAPL CPU package power" if extra else "") + ", measured in each trial"
        return row["gpu_power_w"] + extra, src
    if row.get("cpu_package_w") is not None:
        return row["cpu_package_w"], "RAPL CPU package power, measured in each trial"
    if assumed_w is not None:
        return assumed_w, f"assumed {assumed_w:g} W for the whole machine (power_w), not measured"
    return None, None


def run_system_report(
    run_trial: Callable[[dict, int], dict],
    base_settings: dict,
    candidates: list[dict],
    steps: int,
    out_path: Path,
    config: dict,
    max_trials: int = 3,
    repeats: int = 1,
    job_samples: float | None = None,
    price_per_kwh: float | None = None,
    price_per_gpu_hour: float | None = None,
    currency: str = "",
    power_w: float | None = None,
    gpus: int = 1,
    trial_dir: str | os.PathLike | None = None,
) -> Path:
    """Measure the user's settings, diagnose, measure the relevant candidates, write Markdown (+ .json).

    `run_trial(overrides, steps)` trains `steps` steps with `overrides` applied to the user's settings and
    returns {"samples_per_s", "data_wait_frac", "step_time_ms", "peak_mem_mb", "monitor": summary,
    optional "step_stats", optional "device_type"}; it should run its warm-up steps (compile, worker
    start-up) before it starts timing. Each candidate is an overrides dict, or {"name": str, "overrides": dict}.
    Up to `max_trials` candidates relevant to the verdict are measured (all if none is relevant). With
    `repeats` > 1 every configuration runs that many times in interleaved rounds (A B C, A B C, ...) so
    that drift from other load on the machine hits all of them alike; the table shows medians, and a
    candidate is "faster"/"slower" only when its range of samples/s does not overlap yours (`judge`).
    Candidates judged faster are then measured together as "combined" (interleaved with yours).

    Projection: `job_samples` (training samples of the configured job: epochs x samples per epoch, or
    max_steps x global batch) at each setting's measured samples/s gives hours; power (NVML board power,
    RAPL CPU package power, else the `power_w` you assume) gives kWh; `price_per_kwh` and
    `price_per_gpu_hour` (x `gpus`) give the cost; without `job_samples`, a "job_samples" in the first trial's
    result (your settings) is used. `trial_dir` (where run_trial writes its run folders) is
    deleted when the report is done, also after an error; it must not contain `out_path`.
    """
    if steps < 2:
        raise ValueError(f"run_system_report(steps={steps}): need at least 2 steps per trial")
    if repeats < 1:
        raise ValueError(f"run_system_report(repeats={repeats}): need at least 1 repetition")
    for name, v in (("job_samples", job_samples), ("price_per_kwh", price_per_kwh),
                    ("price_per_gpu_hour", price_per_gpu_hour), ("power_w", power_w)):  # fmt: skip
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v < 0 or not math.isfinite(v)):
            raise ValueError(f"run_system_report({name}={v!r}): must be a finite number >= 0")
    out_path = Path(out_path)
    if trial_dir is not None:
        td = Path(trial_dir).resolve()
        if td == out_path.resolve().parent or td in out_path.resolve().parents:
            raise ValueError(
                f"run_system_report: trial_dir={trial_dir} contains the report {out_path}; give the trials "
                "their own folder (e.g. RUN_DIR/trials), which is deleted afterwards"
            )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _run_report(run_trial, base_settings, candidates, steps, out_path, config, max_trials, repeats,
                           job_samples, price_per_kwh, price_per_gpu_hour, currency, power_w, gpus, trial_dir)  # fmt: skip
    finally:
        remove_trial_dir(trial_dir)


def _run_report(
    run_trial: Callable[[dict, int], dict],
    base_settings: dict,
    candidates: list[dict],
    steps: int,
    out_path: Path,
    config: dict,
    max_trials: int,
    repeats: int,
    job_samples: float | None,
    price_per_kwh: float | None,
    price_per_gpu_hour: float | None,
    currency: str,
    power_w: float | None,
    gpus: int,
    trial_dir: str | os.PathLike | None,
) -> Path:
    trial = lambda ov: _measured_trial(run_trial, ov, steps)  # noqa: E731
    first = trial({})
    if job_samples is None and first.get("job_samples"):  # run_trial may know the job's size once it is built
        job_samples = float(first["job_samples"])
    mon = dict(first.get("monitor") or {})
    dev = first.get("device_type") or config.get("device_type") or str(mon.get("device") or "cpu").split(":")[0]
    step_stats = first.get("step_stats")
    verdict = diagnose(mon, device_type=dev, step_stats=step_stats)

    relevant_keys = RELEVANT_KEYS.get(verdict["verdict"], set())
    parsed = [_candidate(c) for c in candidates]
    chosen = ([c for c in parsed if relevant_keys & set(c[1])] or parsed)[:max_trials]
    runs: dict[str, list[dict]] = {"your settings": [first]}
    errors: dict[str, BaseException] = {}
    for r in range(repeats):
        if r > 0:
            runs["your settings"].append(trial({}))
        for name, ov in chosen:
            if name in errors:
                continue
            try:
                runs.setdefault(name, []).append(trial(ov))
            except Exception as err:  # one failing candidate (e.g. OOM at a bigger batch) must not sink the report
                errors[name] = err
    trials = [_trial_row("your settings", {}, base_settings, runs["your settings"])]
    for name, ov in chosen:
        trials.append(_error_row(name, ov, base_settings, errors[name]) if name in errors
                      else _trial_row(name, ov, base_settings, runs[name]))  # fmt: skip

    helped = [t for t in _judged(trials)[1:] if t.get("judgement") == "faster"]
    if len(helped) > 1:
        merged: dict[str, Any] = {}
        for t in sorted(helped, key=lambda t: t["samples_per_s"]):  # the best one wins a key conflict
            merged.update(t["overrides"])
        try:
            comb = []
            for r in range(repeats):
                if r > 0:  # keep the baseline interleaved with the combined runs too
                    runs["your settings"].append(trial({}))
                comb.append(trial(merged))
            trials.append(_trial_row("combined", merged, base_settings, comb))
            trials[0] = _trial_row("your settings", {}, base_settings, runs["your settings"])
        except Exception as err:
            trials.append(_error_row("combined", merged, base_settings, err))

    for t in trials:
        if t.get("error"):
            continue
        t["power_w"], t["power_source"] = _power(t, power_w)
        t["projection"] = project_job(t.get("samples_per_s"), job_samples, t["power_w"], price_per_kwh,
                                      price_per_gpu_hour, gpus)  # fmt: skip
    profile = dict(mon)
    if step_stats:
        profile["step_stats"] = step_stats
    for k in ("nvml", "cpu_package_w"):
        if first.get(k) is not None:
            profile[k] = first[k]
    hw = config.get("hardware") or hardware_info()
    cfg = {k: v for k, v in config.items() if k not in ("hardware", "device_type")}
    cfg.setdefault("steps_per_trial", steps)
    cfg.setdefault("repeats", repeats)
    for k, v in (("job_samples", job_samples), ("price_per_kwh", price_per_kwh),
                 ("price_per_gpu_hour", price_per_gpu_hour), ("currency", currency), ("power_w", power_w)):  # fmt: skip
        if v not in (None, ""):
            cfg.setdefault(k, v)
    if trial_dir is not None and Path(trial_dir).exists():
        cfg["trial_dir_removed"] = str(trial_dir)
    text = render_report(hw, cfg, profile, verdict, [{k: v for k, v in t.items() if k != "monitor"} for t in trials])
    out_path.write_text(text, encoding="utf-8")
    raw = {"hardware": hw, "config": cfg, "verdict": verdict, "profile": profile,
           "trials": [{k: v for k, v in t.items() if k != "monitor"} | {"judgement": j.get("judgement"),
                                                                         "ratio": j.get("ratio")}
                      for t, j in zip(trials, _judged(trials))],
           "runs": {k: [{kk: vv for kk, vv in m.items() if kk != "monitor"} for m in v] for k, v in runs.items()}}  # fmt: skip
    out_path.with_suffix(".json").write_text(json.dumps(raw, indent=2, default=str), encoding="utf-8")
    return out_path


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description="Print this machine's hardware as Markdown (the report's first part)."
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown (default: Markdown)")
    args = ap.parse_args(argv)
    hw = hardware_info()
    print(json.dumps(hw, indent=2) if args.json else "## Hardware\n\n" + render_hardware(hw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
