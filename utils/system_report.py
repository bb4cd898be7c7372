"""Seed 003's "system resources and training speed" report, built from measurements instead of guesses.

    python -m utils.system_report            # hardware only (Markdown)
    python -m utils.system_report --json     # the same as JSON
    python train_optimized.py --system_report [flags]   # full report: the trainer supplies run_trial

The full report (`run_system_report`) runs the user's configuration for a few steps, diagnoses the
bottleneck (utils/bottleneck.py), measures the candidate settings relevant to that verdict in the same
process, and writes a Markdown page with a before/after table. Ground floor: the trainer hands in
`run_trial(overrides, steps) -> dict`; nothing here imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

try:
    from utils.bottleneck import THRESHOLDS, diagnose
except ImportError:  # copied next to bottleneck.py in another repo
    from bottleneck import THRESHOLDS, diagnose  # type: ignore[no-redef]

__all__ = ["hardware_info", "render_hardware", "render_report", "run_system_report", "RELEVANT_KEYS"]

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
        "precision", "amp", "bf16", "activation_checkpointing", "batch_size", "accumulate_grad_batches", "compile",
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


def hardware_info() -> dict[str, Any]:
    """CPU, RAM, GPUs, driver, CUDA/cuDNN and library versions, OS. Cheap (well under a second)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    vm = psutil.virtual_memory()
    freq = None
    try:
        f = psutil.cpu_freq()
        freq = f.max or f.current if f else None
    except Exception:
        pass
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_usable_cores": usable,
        "cpu_max_mhz": freq or None,
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
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info["gpus"].append({"index": 0, "name": "Apple MPS", "memory_gb": None, "capability": None})
    return info


def render_hardware(hw: dict[str, Any]) -> str:
    """The hardware section as a Markdown table."""
    cores = f"{hw.get('cpu_physical_cores')} physical / {hw.get('cpu_logical_cores')} logical"
    if hw.get("cpu_usable_cores") not in (None, hw.get("cpu_logical_cores")):
        cores += f" ({hw['cpu_usable_cores']} usable by this process)"
    rows = [
        ("CPU", hw.get("cpu_model")),
        ("CPU cores", cores),
        ("RAM", f"{hw.get('ram_total_gb')} GB ({hw.get('ram_available_gb')} GB available)"),
    ]
    gpus = hw.get("gpus") or []
    if gpus:
        for g in gpus:
            mem = f", {g['memory_gb']} GB" if g.get("memory_gb") else ""
            cap = f", compute capability {g['capability']}" if g.get("capability") else ""
            rows.append((f"GPU {g.get('index', 0)}", f"{g.get('name')}{mem}{cap}"))
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


# --------------------------------------------------------------------------- report
def _f(v: Any, spec: str = ".1f", suffix: str = "") -> str:
    if v is None:
        return "n/a"
    try:
        return f"{v:{spec}}{suffix}"
    except (TypeError, ValueError):
        return str(v)


def _settings_str(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if d else "(as given)"


def render_report(
    hardware: dict[str, Any],
    config: dict[str, Any],
    profile: dict[str, Any],
    verdict: dict[str, Any],
    trials: list[dict[str, Any]],
) -> str:
    """Markdown: verdict first, then the measured before/after table, the run's measurements, hardware, config.

    `profile` is the monitor summary of the user's configuration (TrainingMonitor.get_summary()), optionally
    with "step_stats". `trials[0]` is the user's configuration; the others are compared with it.
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
    out += [f"**Do this first:** {verdict.get('advice')}", "", "Evidence:"]
    out += [f"- {e}" for e in verdict.get("evidence", [])]
    for n in verdict.get("notes", []):
        out.append(f"- _Note:_ {n}")

    if trials:
        base = trials[0]
        b_sps = base.get("samples_per_s")
        steps, reps = config.get("steps_per_trial"), config.get("repeats") or 1
        how = (
            f" ({steps} steps each" + (f", median of {reps} interleaved runs" if reps > 1 else "") + ")"
            if steps
            else ""
        )
        out += ["", "## Before / after, measured in this run" + how, ""]
        out += [
            "| settings | changed | samples/s | vs yours | step (ms) | data wait | peak mem (MB) |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for t in trials:
            if t.get("error"):
                out.append(
                    f"| {t.get('name')} | {_settings_str(t.get('overrides') or {})} | failed: {t['error']} | | | | |"
                )
                continue
            sps = t.get("samples_per_s")
            ratio = f"{sps / b_sps:.2f}×" if sps and b_sps else "n/a"
            dw = t.get("data_wait_frac")
            out.append(
                f"| {t.get('name')} | {_settings_str(t.get('overrides') or {}) if t is not base else '—'} | "
                f"{_f(sps)}{_spread(t.get('samples_per_s_reps'))} | {ratio if t is not base else '1.00×'} | {_f(t.get('step_time_ms'))} | "
                f"{_f(None if dw is None else 100 * dw, '.0f', '%')} | {_f(t.get('peak_mem_mb'), '.0f')} |"
            )
        ok = [t for t in trials if not t.get("error") and t.get("samples_per_s")]
        best = max(ok, key=lambda t: t["samples_per_s"]) if ok else None
        out.append("")
        if best is not None and best is not base and b_sps and best["samples_per_s"] > b_sps * 1.05:
            out.append(
                f"**Recommended:** {_settings_str(best.get('overrides') or {})} — "
                f"{best['samples_per_s'] / b_sps:.2f}× your samples/s on this machine."
            )
            if "batch_size" in (best.get("overrides") or {}):
                out.append(
                    "A different batch size changes the optimisation: rescale the learning rate "
                    "(--lr_scaling sqrt|linear) or keep the effective batch with gradient accumulation."
                )
        else:
            out.append("**Recommended:** keep your settings; no candidate was more than 5% faster here.")
        out.append(
            "Throughput is samples per second (iterations per second hide the batch size). Short trials are "
            "noisy: differences under ~10% are within run-to-run variation."
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

    out += ["", "## Hardware", "", render_hardware(hardware)]
    hidden = ("title", "note", "generated", "command", "steps_per_trial", "repeats")
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
        "samples_per_s_reps": [val(m, "samples_per_s", "samples_per_s") for m in runs],
    }
    if runs and "monitor" in runs[0]:
        row["monitor"] = runs[0]["monitor"]
    return row


def _error_row(name: str, overrides: dict, base_settings: dict, err: BaseException) -> dict[str, Any]:
    first = str(err).splitlines()[0][:120] if str(err) else ""
    return {"name": name, "overrides": overrides, "settings": {**base_settings, **overrides},
            "error": f"{type(err).__name__}: {first}"}  # fmt: skip


def run_system_report(
    run_trial: Callable[[dict, int], dict],
    base_settings: dict,
    candidates: list[dict],
    steps: int,
    out_path: Path,
    config: dict,
    max_trials: int = 3,
    repeats: int = 1,
) -> Path:
    """Measure the user's settings, diagnose, measure the relevant candidates, write Markdown (+ .json).

    `run_trial(overrides, steps)` trains `steps` steps with `overrides` applied to the user's settings and
    returns {"samples_per_s", "data_wait_frac", "step_time_ms", "peak_mem_mb", "monitor": summary,
    optional "step_stats", optional "device_type"}; it should run its warm-up steps (compile, worker
    start-up) before it starts timing. Each candidate is an overrides dict, or {"name": str, "overrides": dict}.
    Up to `max_trials` candidates relevant to the verdict are measured (all if none is relevant). With
    `repeats` > 1 every configuration runs that many times in interleaved rounds (A B C, A B C, ...) so
    that drift from other load on the machine hits all of them alike; the table shows medians. Candidates
    that helped by more than 5% are then measured together as "combined" (interleaved with yours).
    """
    if steps < 2:
        raise ValueError(f"run_system_report(steps={steps}): need at least 2 steps per trial")
    if repeats < 1:
        raise ValueError(f"run_system_report(repeats={repeats}): need at least 1 repetition")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    first = run_trial({}, steps)
    if not isinstance(first, dict):
        raise TypeError(f"run_trial must return a dict of measurements, got {type(first)}")
    mon = dict(first.get("monitor") or {})
    dev = (
        first.get("device_type") or config.get("device_type") or str(mon.get("device") or "cpu").split(":")[0]
    )
    step_stats = first.get("step_stats")
    verdict = diagnose(mon, device_type=dev, step_stats=step_stats)

    relevant_keys = RELEVANT_KEYS.get(verdict["verdict"], set())
    parsed = [_candidate(c) for c in candidates]
    chosen = ([c for c in parsed if relevant_keys & set(c[1])] or parsed)[:max_trials]
    runs: dict[str, list[dict]] = {"your settings": [first]}
    errors: dict[str, BaseException] = {}
    for r in range(repeats):
        if r > 0:
            runs["your settings"].append(run_trial({}, steps))
        for name, ov in chosen:
            if name in errors:
                continue
            try:
                runs.setdefault(name, []).append(run_trial(ov, steps))
            except (
                Exception
            ) as err:  # one failing candidate (e.g. OOM at a bigger batch) must not sink the report
                errors[name] = err
    trials = [_trial_row("your settings", {}, base_settings, runs["your settings"])]
    for name, ov in chosen:
        trials.append(_error_row(name, ov, base_settings, errors[name]) if name in errors
                      else _trial_row(name, ov, base_settings, runs[name]))  # fmt: skip

    b_sps = trials[0].get("samples_per_s") or 0.0
    helped = [t for t in trials[1:] if not t.get("error") and (t.get("samples_per_s") or 0) > 1.05 * b_sps]
    if len(helped) > 1:
        merged: dict[str, Any] = {}
        for t in sorted(helped, key=lambda t: t["samples_per_s"]):  # the best one wins a key conflict
            merged.update(t["overrides"])
        try:
            comb = []
            for r in range(repeats):
                if r > 0:  # keep the baseline interleaved with the combined runs too
                    runs["your settings"].append(run_trial({}, steps))
                comb.append(run_trial(merged, steps))
            trials.append(_trial_row("combined", merged, base_settings, comb))
            trials[0] = _trial_row("your settings", {}, base_settings, runs["your settings"])
        except Exception as err:
            trials.append(_error_row("combined", merged, base_settings, err))

    profile = dict(mon)
    if step_stats:
        profile["step_stats"] = step_stats
    hw = config.get("hardware") or hardware_info()
    cfg = {k: v for k, v in config.items() if k not in ("hardware", "device_type")}
    cfg.setdefault("steps_per_trial", steps)
    cfg.setdefault("repeats", repeats)
    text = render_report(
        hw, cfg, profile, verdict, [{k: v for k, v in t.items() if k != "monitor"} for t in trials]
    )
    out_path.write_text(text, encoding="utf-8")
    raw = {"hardware": hw, "config": cfg, "verdict": verdict, "profile": profile, "trials": trials,
           "runs": {k: [{kk: vv for kk, vv in m.items() if kk != "monitor"} for m in v] for k, v in runs.items()}}  # fmt: skip
    out_path.with_suffix(".json").write_text(json.dumps(raw, indent=2, default=str), encoding="utf-8")
    return out_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Print this machine's hardware as Markdown (the report's first part)."
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown (default: Markdown)")
    args = ap.parse_args(argv)
    hw = hardware_info()
    print(json.dumps(hw, indent=2) if args.json else "## Hardware\n\n" + render_hardware(hw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
