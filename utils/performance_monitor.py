"""Measure where a training run's time goes: step times, data wait, CPU/RAM and GPU telemetry.

Seed 001's API, kept:

    monitor = TrainingMonitor()
    monitor.start_monitoring()
    ...                                   # in the loop: monitor.log_iteration(step_seconds)
    monitor.stop_monitoring()
    print(monitor.get_summary())

`log_iteration` is called on the hot path: it appends to preallocated-style arrays and never touches
the GPU. Everything else (CPU, RAM, GPU utilisation/memory/power/temperature) is read by a background
thread about once a second. The thread measures its own CPU time so the summary can say what the
monitor itself cost (`sampler_overhead_frac`).

GPU telemetry comes from NVML (package `nvidia-ml-py`, module `pynvml`); when NVML is missing but
`nvidia-smi` exists, one long-lived `nvidia-smi --query-gpu ... -lms` process streams the same fields
(one process for the whole run, not one per sample). Peak memory comes from torch's allocator, which
is what the batch size actually competes for. Depends on psutil (and optionally torch, pynvml).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from array import array
from typing import Any

import psutil

try:  # torch is optional here so the monitor can watch non-torch work too
    import torch
except ImportError:  # pragma: no cover - torch is always present in plainloop
    torch = None  # type: ignore[assignment]

__all__ = ["TrainingMonitor", "percentile"]

_MB = 1024.0**2
_GB = 1024.0**3


def percentile(sorted_values: list[float] | array, q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an already sorted sequence."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty sequence")
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


# --------------------------------------------------------------------------- GPU backends
class _NvmlBackend:
    """Reads one GPU through NVML. Raises on construction when NVML or the GPU is unavailable."""

    name = "nvml"

    def __init__(self, cuda_index: int) -> None:
        import pynvml  # nvidia-ml-py

        self._nv = pynvml
        pynvml.nvmlInit()
        self.handle = self._find_handle(cuda_index)
        self.total_mb = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total / _MB
        try:
            self.power_limit_w: float | None = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0
        except Exception:
            self.power_limit_w = None
        self._energy_mj0 = self._energy_mj()

    def _find_handle(self, cuda_index: int) -> Any:
        # CUDA and NVML may number GPUs differently (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), so match
        # by PCI bus id when torch can tell us; fall back to the index.
        nv = self._nv
        if torch is not None and torch.cuda.is_available():
            try:
                p = torch.cuda.get_device_properties(cuda_index)
                bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
                return nv.nvmlDeviceGetHandleByPciBusId(bus)
            except Exception:
                pass
        return nv.nvmlDeviceGetHandleByIndex(cuda_index)

    def _energy_mj(self) -> float | None:
        # Volta and newer keep a board energy counter (millijoules); more exact than integrating power.
        try:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:
            return None

    def energy_j_since_start(self) -> float | None:
        now = self._energy_mj()
        if now is None or self._energy_mj0 is None:
            return None
        return (now - self._energy_mj0) / 1000.0

    def sample(self) -> dict[str, float | None]:
        nv, h = self._nv, self.handle
        out: dict[str, float | None] = {"util": None, "mem_used_mb": None, "power_w": None, "temp_c": None}
        try:
            out["util"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:
            pass
        try:
            out["mem_used_mb"] = nv.nvmlDeviceGetMemoryInfo(h).used / _MB
        except Exception:
            pass
        try:
            out["power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            pass
        try:
            out["temp_c"] = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        except Exception:
            pass
        return out

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


class _SmiBackend:
    """Fallback: one `nvidia-smi -lms` process streams CSV lines; the sampler reads the latest one."""

    name = "nvidia-smi"
    _FIELDS = "utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"

    def __init__(self, cuda_index: int, interval: float) -> None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            raise RuntimeError("nvidia-smi not found")
        self.proc = subprocess.Popen(
            [exe, f"--id={cuda_index}", f"--query-gpu={self._FIELDS}", "--format=csv,noheader,nounits",
             f"-lms={max(100, int(interval * 1000))}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )  # fmt: skip
        self._latest: dict[str, float | None] = {}
        self.total_mb: float | None = None
        self.power_limit_w: float | None = None
        self._reader = threading.Thread(target=self._read, name="nvidia-smi-reader", daemon=True)
        self._reader.start()

    @staticmethod
    def parse_line(line: str) -> dict[str, float | None]:
        def num(s: str) -> float | None:
            try:
                return float(s.strip())
            except ValueError:  # "[N/A]", "[Not Supported]"
                return None

        parts = line.split(",")
        if len(parts) < 5:
            return {}
        util, used, total, power, temp = (num(p) for p in parts[:5])
        return {"util": util, "mem_used_mb": used, "mem_total_mb": total, "power_w": power, "temp_c": temp}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # blocks in the reader thread only
            parsed = self.parse_line(line)
            if parsed:
                self._latest = parsed
                if parsed.get("mem_total_mb"):
                    self.total_mb = parsed["mem_total_mb"]

    def energy_j_since_start(self) -> float | None:
        return None

    def sample(self) -> dict[str, float | None]:
        d = dict(self._latest)
        d.pop("mem_total_mb", None)
        return d

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _open_gpu_backend(cuda_index: int, interval: float) -> Any | None:
    for make in (lambda: _NvmlBackend(cuda_index), lambda: _SmiBackend(cuda_index, interval)):
        try:
            return make()
        except Exception:
            continue
    return None


# --------------------------------------------------------------------------- the monitor
class TrainingMonitor:
    """Host-side step timer plus a ~1 Hz resource sampler.

    Args:
        interval: seconds between background samples (default 1.0).
        device: the training device; None picks CUDA device `torch.cuda.current_device()` when CUDA
            is available, else CPU. GPU telemetry is collected only for a CUDA device.
        batch_size: samples per iteration, used when `log_iteration` is called without `samples`.
        warmup_iters: leading iterations left out of the step-time percentiles (compile, cuDNN
            autotuning and worker start-up make them unrepresentative). They still count in totals.
    """

    def __init__(
        self,
        interval: float = 1.0,
        device: Any = None,
        batch_size: int | None = None,
        warmup_iters: int = 1,
    ) -> None:
        if not (interval > 0):
            raise ValueError(f"TrainingMonitor(interval={interval!r}): interval must be > 0 seconds")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(
                f"TrainingMonitor(batch_size={batch_size!r}): must be a positive integer or None"
            )
        self.interval = float(interval)
        self.batch_size = batch_size
        self.warmup_iters = max(0, int(warmup_iters))
        self.device = self._resolve_device(device)
        self._reset()

    # ---- setup
    @staticmethod
    def _resolve_device(device: Any) -> Any:
        if torch is None:
            return None
        if device is None:
            if torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    @property
    def _is_cuda(self) -> bool:
        return (
            torch is not None
            and self.device is not None
            and self.device.type == "cuda"
            and torch.cuda.is_available()
        )

    def _reset(self) -> None:
        self._iter_s = array("d")  # one float per step: 8 bytes, append is amortised O(1)
        self._sum_s = 0.0
        self._sum_data_s = 0.0
        self._samples = 0
        self._samples_known = True
        # background samples: (t, cpu_sys_pct, proc_cpu_pct, ram_used_gb, rss_gb, gpu dict)
        self._rows: list[dict[str, Any]] = []
        self._timeline: list[dict[str, float]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = self._t1 = None  # type: float | None
        self._sampler_cpu_s = 0.0
        self._gpu: Any = None
        self._gpu_energy_j: float | None = None
        self._peak_alloc_mb: float | None = None
        self._peak_reserved_mb: float | None = None
        self._alloc_retries: int | None = None

    # ---- public API
    def start_monitoring(self) -> None:
        """Start the clock and the background sampler. Resets the CUDA allocator's peak counters."""
        if self._thread is not None:
            raise RuntimeError(
                "TrainingMonitor.start_monitoring() called twice; call stop_monitoring() first"
            )
        self._reset()
        if self._is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._gpu = _open_gpu_backend(self.device.index or 0, self.interval)
        self._proc = psutil.Process(os.getpid())
        self._children: dict[int, psutil.Process] = {}
        self._proc.cpu_percent(None)  # prime: psutil's first call returns 0.0
        psutil.cpu_percent(None)
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="TrainingMonitor", daemon=True)
        self._thread.start()

    def log_iteration(self, seconds: float, data_seconds: float = 0.0, samples: int | None = None) -> None:
        """Record one training step, timed on the host.

        `seconds` is the whole step (waiting for the batch + compute); `data_seconds` the part of it
        spent waiting for the loader; `samples` the batch size of this step (default: `batch_size`).
        O(1), no device sync: call it every step.
        """
        if seconds < 0 or data_seconds < 0:
            raise ValueError(
                f"log_iteration(seconds={seconds}, data_seconds={data_seconds}): times must be >= 0"
            )
        if data_seconds > seconds * 1.000001 + 1e-9:
            raise ValueError(
                f"log_iteration(seconds={seconds}, data_seconds={data_seconds}): `seconds` is the whole step "
                "including the data wait, so data_seconds cannot exceed it"
            )
        self._iter_s.append(seconds)
        self._sum_s += seconds
        self._sum_data_s += data_seconds
        n = samples if samples is not None else self.batch_size
        if n is None:
            self._samples_known = False
        else:
            self._samples += n

    def stop_monitoring(self) -> None:
        """Stop the sampler and read the allocator's peaks. Safe to call twice."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5 * self.interval + 1)
        self._thread = None
        self._t1 = time.perf_counter()
        if self._is_cuda:
            # Deliberate sync-free reads: these are allocator counters, no kernel is waited on.
            self._peak_alloc_mb = torch.cuda.max_memory_allocated(self.device) / _MB
            self._peak_reserved_mb = torch.cuda.max_memory_reserved(self.device) / _MB
            self._alloc_retries = int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))
        if self._gpu is not None:
            self._gpu_energy_j = self._gpu.energy_j_since_start()
            self._gpu.close()

    def get_timeline(self) -> list[dict[str, float]]:
        """Per-sample rows: t (s since start), iterations, samples_per_s, data_wait_frac, cpu/GPU values."""
        return list(self._timeline)

    # ---- the sampler thread
    def _proc_tree_cpu(self) -> float:
        # Training process plus its loader workers, in % of one core (200 = two busy cores).
        total = self._proc.cpu_percent(None)
        try:
            kids = self._proc.children(recursive=True)
        except psutil.Error:
            kids = []
        alive = {}
        for k in kids:
            p = self._children.get(k.pid)
            if p is None:  # first sight: prime it, its value counts from the next sample
                p = k
                try:
                    p.cpu_percent(None)
                except psutil.Error:
                    continue
                alive[k.pid] = p
                continue
            try:
                total += p.cpu_percent(None)
                alive[k.pid] = p
            except psutil.Error:
                pass
        self._children = alive
        return total

    def _sample_once(self, last: dict[str, float]) -> None:
        now = time.perf_counter()
        vm = psutil.virtual_memory()
        try:
            rss = self._proc.memory_info().rss / _GB
        except psutil.Error:
            rss = float("nan")
        row: dict[str, Any] = {
            "t": now - (self._t0 or now),
            "cpu_percent": psutil.cpu_percent(None),
            "proc_cpu_percent": self._proc_tree_cpu(),
            "ram_used_gb": (vm.total - vm.available) / _GB,
            "rss_gb": rss,
        }
        if self._gpu is not None:
            row.update({f"gpu_{k}": v for k, v in self._gpu.sample().items()})
        self._rows.append(row)
        # Throughput over the last interval, from counters the hot path already keeps (racy reads of
        # floats/ints are fine: a sample may be one step off).
        n_it, s_sum, d_sum, smp = len(self._iter_s), self._sum_s, self._sum_data_s, self._samples
        dt = now - last["t"]
        d_iter = n_it - last["n"]
        d_s = s_sum - last["s"]
        tl = {
            "t": row["t"],
            "iterations": float(n_it),
            "iters_per_s": d_iter / dt if dt > 0 else 0.0,
            "samples_per_s": (smp - last["smp"]) / dt if dt > 0 and self._samples_known else float("nan"),
            "data_wait_frac": (d_sum - last["d"]) / d_s if d_s > 0 else float("nan"),
            "cpu_percent": row["cpu_percent"],
        }
        if "gpu_util" in row:
            tl["gpu_util"] = row["gpu_util"] if row["gpu_util"] is not None else float("nan")
        self._timeline.append(tl)
        last.update(t=now, n=n_it, s=s_sum, d=d_sum, smp=smp)

    def _run(self) -> None:
        c0 = time.thread_time()
        last = {"t": self._t0 or time.perf_counter(), "n": 0, "s": 0.0, "d": 0.0, "smp": 0}
        while not self._stop.wait(self.interval):
            try:
                self._sample_once(last)
            except Exception:  # never let telemetry kill a training run
                pass
            self._sampler_cpu_s = time.thread_time() - c0
        try:
            self._sample_once(last)  # one last row so short runs have at least one
        except Exception:
            pass
        self._sampler_cpu_s = time.thread_time() - c0

    # ---- results
    def get_summary(self) -> dict[str, Any]:
        """A JSON-serialisable dict; may be called while running (values so far)."""
        end = self._t1 if self._t1 is not None else time.perf_counter()
        wall = (end - self._t0) if self._t0 is not None else 0.0
        n = len(self._iter_s)
        steady = self._iter_s[self.warmup_iters :] if n > self.warmup_iters else self._iter_s
        srt = sorted(steady)
        iter_time = (
            {
                "p50": percentile(srt, 50),
                "p90": percentile(srt, 90),
                "p99": percentile(srt, 99),
                "mean": sum(srt) / len(srt),
                "min": srt[0],
                "max": srt[-1],
            }
            if srt
            else None
        )
        busy = self._sum_s
        rows = list(self._rows)

        def mean(key: str) -> float | None:
            vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
            return sum(vals) / len(vals) if vals else None

        def vmax(key: str) -> float | None:
            vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
            return max(vals) if vals else None

        energy_j, energy_src = self._gpu_energy_j, "nvml_energy_counter"
        if energy_j is None:
            p = mean("gpu_power_w")
            energy_j, energy_src = (p * wall, "mean_power_x_wall") if p is not None else (None, None)
        gpu_total = getattr(self._gpu, "total_mb", None)
        if gpu_total is None and self._is_cuda:
            gpu_total = torch.cuda.get_device_properties(self.device).total_memory / _MB
        samples_known = self._samples_known and n > 0
        return {
            "device": str(self.device) if self.device is not None else None,
            "iterations": n,
            "samples": self._samples if samples_known else None,
            "wall_s": wall,
            "step_s_total": busy,
            "iter_time_s": iter_time,
            "iter_time_warmup_excluded": min(self.warmup_iters, max(n - 1, 0)),
            "iters_per_s": n / busy if busy > 0 else None,
            "samples_per_s": self._samples / busy if busy > 0 and samples_known else None,
            "data_wait_frac": self._sum_data_s / busy if busy > 0 else None,
            "compute_frac": 1.0 - self._sum_data_s / busy if busy > 0 else None,
            "cpu_count_logical": psutil.cpu_count(logical=True),
            "cpu_percent_mean": mean("cpu_percent"),
            "process_cpu_percent_mean": mean("proc_cpu_percent"),
            "ram_used_gb_max": vmax("ram_used_gb"),
            "ram_total_gb": psutil.virtual_memory().total / _GB,
            "process_rss_gb_max": vmax("rss_gb"),
            "peak_gpu_mem_mb": self._peak_alloc_mb,
            "peak_gpu_reserved_mb": self._peak_reserved_mb,
            "gpu_mem_total_mb": gpu_total,
            "gpu_mem_used_mb_max": vmax("gpu_mem_used_mb"),
            "gpu_alloc_retries": self._alloc_retries,
            "gpu_util_mean": mean("gpu_util"),
            "gpu_power_w_mean": mean("gpu_power_w"),
            "gpu_power_limit_w": getattr(self._gpu, "power_limit_w", None),
            "gpu_temp_c_max": vmax("gpu_temp_c"),
            "energy_kwh": energy_j / 3.6e6 if energy_j is not None else None,
            "energy_source": energy_src if energy_j is not None else None,
            "gpu_telemetry": getattr(self._gpu, "name", None),
            "sampler_interval_s": self.interval,
            "sampler_samples": len(rows),
            "sampler_cpu_s": self._sampler_cpu_s,
            "sampler_overhead_frac": self._sampler_cpu_s / wall if wall > 0 else None,
        }

    def format_summary(self) -> str:
        """A few human-readable lines."""
        return format_summary(self.get_summary())

    def __enter__(self) -> TrainingMonitor:
        self.start_monitoring()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_monitoring()


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def format_summary(s: dict[str, Any]) -> str:
    """Render a `TrainingMonitor.get_summary()` dict as a few lines."""
    it = s.get("iter_time_s") or {}
    ms = {k: (v * 1000 if v is not None else None) for k, v in it.items()}
    lines = [
        f"steps {s.get('iterations', 0)} in {_fmt(s.get('wall_s'), '.1f', ' s')} | "
        f"{_fmt(s.get('samples_per_s'), '.1f', ' samples/s')} | {_fmt(s.get('iters_per_s'), '.2f', ' it/s')}",
        f"step time p50 {_fmt(ms.get('p50'), '.1f', ' ms')}, p90 {_fmt(ms.get('p90'), '.1f', ' ms')}, "
        f"p99 {_fmt(ms.get('p99'), '.1f', ' ms')} | data wait "
        f"{_fmt(None if s.get('data_wait_frac') is None else 100 * s['data_wait_frac'], '.0f', '%')} of step time",
        f"CPU {_fmt(s.get('cpu_percent_mean'), '.0f', '%')} (system), training process + workers "
        f"{_fmt(s.get('process_cpu_percent_mean'), '.0f', '% of a core')} | RAM max "
        f"{_fmt(s.get('ram_used_gb_max'), '.1f', ' GB')}",
    ]
    if s.get("gpu_util_mean") is not None or s.get("peak_gpu_mem_mb") is not None:
        lines.append(
            f"GPU util {_fmt(s.get('gpu_util_mean'), '.0f', '%')}, power {_fmt(s.get('gpu_power_w_mean'), '.0f', ' W')}, "
            f"peak allocated {_fmt(s.get('peak_gpu_mem_mb'), '.0f', ' MB')} of "
            f"{_fmt(s.get('gpu_mem_total_mb'), '.0f', ' MB')}, energy {_fmt(s.get('energy_kwh'), '.4f', ' kWh')}"
        )
    lines.append(
        f"monitor overhead {_fmt(None if s.get('sampler_overhead_frac') is None else 100 * s['sampler_overhead_frac'], '.2f', '%')} "
        f"of one core ({s.get('sampler_samples', 0)} samples)"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # quick self-check: python -m utils.performance_monitor
    mon = TrainingMonitor(interval=0.2, batch_size=32)
    mon.start_monitoring()
    for _ in range(20):
        t = time.perf_counter()
        time.sleep(0.02)
        mon.log_iteration(time.perf_counter() - t, data_seconds=0.005)
    mon.stop_monitoring()
    print(mon.format_summary())
