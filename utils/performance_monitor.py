"""Measure where a training run's time goes: step times, data wait, CPU/RAM and GPU telemetry.

Use:

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

Honest by construction: what was not measured is reported as None and listed in the summary's
`not_measured`, never as 0 (a step logged without `data_seconds` has an unknown data wait, not a zero
one). CPU shares come from the monitor's own CPU-time counters taken at start and stop, so they are valid
on short runs and are not disturbed by other callers of psutil.cpu_percent(). The summary also records
contention: how much of the machine other processes took (CPU cores, hypervisor steal, the busiest other
processes) and, with NVML, other processes on the same GPU.
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

__all__ = ["TrainingMonitor", "format_summary", "job_root_pid", "percentile", "usable_cpu_cores", "usable_cpus"]

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
        try:
            self.total_mb: float | None = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total / _MB
        except Exception:
            self.total_mb = None
        self._proc_ts = 0  # newest per-process sample already read (nvmlDeviceGetProcessUtilization)
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
                # the PCI fields exist at runtime (torch >= 2.2) but torch's stub omits them
                bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"  # type: ignore[attr-defined]
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

    def utilization(self) -> tuple[float | None, float | None, float | None]:
        """(kernel-busy %, memory-controller %, this process's SM %) now; None where NVML cannot say.

        Kernel-busy is utilization.gpu (the "sm" column of `nvidia-smi dmon`); memory-controller is the time the
        device memory was read or written; the process's SM % comes from its per-process samples."""
        nv, h = self._nv, self.handle
        gpu = mem = sm = None
        try:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            gpu, mem = float(u.gpu), float(u.memory)
        except Exception:
            pass
        try:
            mine = [x for x in nv.nvmlDeviceGetProcessUtilization(h, self._proc_ts) if x.pid == os.getpid()]
            if mine:
                sm = float(max(x.smUtil for x in mine))
                self._proc_ts = max(int(x.timeStamp) for x in mine)
        except Exception:  # no process samples yet, or not supported
            pass
        return gpu, mem, sm

    def processes(self) -> dict[int, float | None] | None:
        """{pid: used MB or None} of every process with a context on this GPU; None when NVML cannot say.

        NVML reports PIDs in the host's namespace: inside a container our own PID may not appear."""
        found: dict[int, float | None] = {}
        answered = False
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            get = getattr(self._nv, fn, None)
            if get is None:
                continue
            try:
                procs = get(self.handle)
            except Exception:
                continue
            answered = True
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                found[int(p.pid)] = used / _MB if isinstance(used, (int, float)) else None
        return found if answered else None

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

    def processes(self) -> None:
        return None  # nvidia-smi's per-process query would need a second process; not measured

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


# --------------------------------------------------------------------------- CPU accounting
_MIN_CPU_WINDOW_S = 0.25  # CPU counters tick every 10 ms: shorter windows give 0 % or noise, not a figure


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _system_cpu() -> tuple[float, float, float]:
    """(total, busy, steal) CPU seconds over all cores since boot, counted as psutil.cpu_percent counts them."""
    t = psutil.cpu_times()
    # Linux already counts guest time inside user/nice; adding it again would inflate the total
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    busy = total - t.idle - getattr(t, "iowait", 0.0)
    return total, busy, getattr(t, "steal", 0.0)


def _cgroup_quota_cores() -> float | None:
    """CPU cores a cgroup quota allows this process (docker --cpus, Kubernetes limits); None without one."""
    try:  # cgroup v2: "max 100000" (no quota) or "200000 100000" (2 cores)
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return float(quota) / float(period) if quota != "max" else None
    except (OSError, ValueError):
        pass
    for d in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):  # cgroup v1
        try:
            with open(f"{d}/cpu.cfs_quota_us", encoding="ascii") as f:
                quota_us = float(f.read())
            with open(f"{d}/cpu.cfs_period_us", encoding="ascii") as f:
                period_us = float(f.read())
            return quota_us / period_us if quota_us > 0 and period_us > 0 else None
        except (OSError, ValueError):
            continue
    return None


def job_root_pid() -> int:
    """The process whose tree is "this run": torchrun starts one process per local rank under one launcher,
    and those siblings are the same job, not other processes taking the CPU."""
    try:
        if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
            return os.getppid()
    except ValueError:
        pass
    return os.getpid()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity; all logical CPUs where the OS has no affinity call)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1


def usable_cpu_cores() -> float:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota when there is one."""
    n = float(usable_cpus())
    q = _cgroup_quota_cores()
    return min(n, q) if q else n


class _TreeCpu:
    """CPU seconds used since a start point by one process and its descendants (loader workers)."""

    def __init__(self, proc: psutil.Process, t0_wall: float) -> None:
        self.proc, self.t0_wall = proc, t0_wall
        self.base = _cpu_s(proc)
        self.kids: dict[int, list[Any]] = {}  # pid -> [Process, cpu_s at start or 0, last cpu_s]
        self.seconds()

    def pids(self) -> set[int]:
        return {self.proc.pid, *self.kids}

    def seconds(self) -> float:
        try:
            own = _cpu_s(self.proc) - self.base
            kids = self.proc.children(recursive=True)
        except psutil.Error:
            return float("nan")
        for k in kids:
            e = self.kids.get(k.pid)
            try:
                if e is None or e[0] != k:  # new child, or a recycled pid
                    now = _cpu_s(k)
                    born_after = k.create_time() >= self.t0_wall - 0.01
                    self.kids[k.pid] = [k, 0.0 if born_after else now, now]
                else:
                    e[2] = _cpu_s(k)
            except psutil.Error:
                pass  # exited between listing and reading: its last reading stands
        return own + sum(e[2] - e[1] for e in self.kids.values())


class _RunQueueWait:
    """Linux: CPU time and run-queue wait (runnable, but no free core) of every thread of the given processes.

    Read from /proc/<pid>/task/<tid>/schedstat ("cpu_ns wait_ns slices"). Waiting is what contention costs
    this run; a sleeping or blocked thread does not wait in the run queue, so an idle loop shows none."""

    def __init__(self) -> None:
        self.base: dict[tuple[int, str], tuple[int, int]] = {}
        self.last: dict[tuple[int, str], tuple[int, int]] = {}
        self.first = True

    def read(self, pids: set[int]) -> tuple[float, float] | None:
        """(CPU seconds, wait seconds) since the first read; None where schedstat does not exist."""
        for pid in pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                        fields = f.read().split()
                    v = (int(fields[0]), int(fields[1]))
                except (OSError, ValueError, IndexError):
                    continue
                key = (pid, tid)
                if key not in self.base:  # a thread born after the first read counts from 0
                    self.base[key] = v if self.first else (0, 0)
                self.last[key] = v
        self.first = False
        if not self.last:
            return None
        cpu = sum(v[0] - self.base[k][0] for k, v in self.last.items())
        wait = sum(v[1] - self.base[k][1] for k, v in self.last.items())
        return cpu / 1e9, wait / 1e9


def _process_cpu_table() -> dict[tuple[int, float], tuple[str, float]]:
    """{(pid, create_time): (name, cpu seconds)} of every process we may read."""
    out = {}
    for p in psutil.process_iter(["name", "cpu_times", "create_time"]):
        info = p.info
        ct, t = info.get("create_time"), info.get("cpu_times")
        if ct is None or t is None:
            continue
        out[(p.pid, ct)] = (info.get("name") or "?", t.user + t.system)
    return out


def _busiest_others(
    before: dict[tuple[int, float], tuple[str, float]],
    after: dict[tuple[int, float], tuple[str, float]],
    ours: set[int],
    t0_wall: float,
    wall: float,
    top: int = 5,
) -> list[dict[str, Any]]:
    """The processes outside our tree that used the most CPU between two tables, in cores (1.0 = one core)."""
    rows: list[dict[str, Any]] = []
    for key, (name, cpu) in after.items():
        if key[0] in ours:
            continue
        if key in before:
            used = cpu - before[key][1]
        elif key[1] >= t0_wall - 0.01:  # started during the run: all its CPU time is inside the window
            used = cpu
        else:
            continue
        if used / wall >= 0.05:
            rows.append({"pid": key[0], "name": name, "cpu_cores": round(used / wall, 2)})
    return sorted(rows, key=lambda r: -r["cpu_cores"])[:top]


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
        watch_other_processes: list the processes outside this one that used the most CPU during the run
            (one scan of the process table at start and one at stop, in the sampler thread).
    """

    def __init__(
        self,
        interval: float = 1.0,
        device: Any = None,
        batch_size: int | None = None,
        warmup_iters: int = 1,
        watch_other_processes: bool = True,
    ) -> None:
        if not (interval > 0):
            raise ValueError(f"TrainingMonitor(interval={interval!r}): interval must be > 0 seconds")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"TrainingMonitor(batch_size={batch_size!r}): must be a positive integer or None")
        self.interval = float(interval)
        self.batch_size = batch_size
        self.warmup_iters = max(0, int(warmup_iters))
        self.watch_other_processes = bool(watch_other_processes)
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
            torch is not None and self.device is not None and self.device.type == "cuda" and torch.cuda.is_available()
        )

    def _reset(self) -> None:
        self._iter_s = array("d")  # one float per step: 8 bytes, append is amortised O(1)
        self._sum_s = 0.0
        self._sum_data_s = 0.0
        self._sum_s_data_known = 0.0  # step time of the steps logged with data_seconds
        self._n_data_known = 0
        self._samples = 0
        self._samples_known = True
        self._rows: list[dict[str, Any]] = []  # background samples
        self._timeline: list[dict[str, float]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = self._t1 = None  # type: float | None
        self._t0_wall = 0.0
        self._sampler_cpu_s = 0.0
        self._gpu: Any = None
        self._gpu_energy_j: float | None = None
        self._peak_alloc_mb: float | None = None
        self._peak_reserved_mb: float | None = None
        self._alloc_retries: int | None = None
        # CPU accounting: (perf time, system total, busy, steal, our tree's CPU seconds) at start and latest
        self._tree: _TreeCpu | None = None
        self._cpu0: tuple[float, float, float, float, float] | None = None
        self._cpu_last: tuple[float, float, float, float, float] | None = None
        self._procs0: dict | None = None
        self._rq: _RunQueueWait | None = None
        self._rq_last: tuple[float, float] | None = None  # (CPU s, run-queue wait s) since start
        self._others_top: list[dict[str, Any]] | None = None
        # other processes on our GPU (NVML)
        self._gpu_proc_samples = 0
        self._gpu_other_counts: list[int] = []
        self._gpu_own_visible: bool | None = None
        self._gpu_others: dict[int, dict[str, Any]] = {}

    # ---- public API
    def start_monitoring(self) -> None:
        """Start the clock and the background sampler. Resets the CUDA allocator's peak counters."""
        if self._thread is not None:
            raise RuntimeError("TrainingMonitor.start_monitoring() called twice; call stop_monitoring() first")
        self._reset()
        if self._is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._gpu = _open_gpu_backend(self.device.index or 0, self.interval)
        self._proc = psutil.Process(os.getpid())
        self._t0_wall = time.time()
        try:
            root = self._proc if job_root_pid() == self._proc.pid else psutil.Process(job_root_pid())
            self._tree = _TreeCpu(root, self._t0_wall)
            self._cpu0 = (time.perf_counter(), *_system_cpu(), 0.0)
            self._cpu_last = self._cpu0
            self._rq = _RunQueueWait()
            self._rq_last = self._rq.read(self._tree.pids())
        except (psutil.Error, OSError):
            self._tree = None  # CPU shares stay None (reported as not measured)
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="TrainingMonitor", daemon=True)
        self._thread.start()

    def log_iteration(self, seconds: float, data_seconds: float | None = None, samples: int | None = None) -> None:
        """Record one training step, timed on the host.

        `seconds` is the whole step (waiting for the batch + compute); `data_seconds` the part of it
        spent waiting for the loader, or None when it was not measured (then the data wait is reported
        as unknown, never as 0); `samples` the batch size of this step (default: `batch_size`).
        O(1), no device sync: call it every step.
        """
        if seconds < 0 or (data_seconds is not None and data_seconds < 0):
            raise ValueError(f"log_iteration(seconds={seconds}, data_seconds={data_seconds}): times must be >= 0")
        self._iter_s.append(seconds)
        self._sum_s += seconds
        if data_seconds is not None:
            if data_seconds > seconds * 1.000001 + 1e-9:
                raise ValueError(
                    f"log_iteration(seconds={seconds}, data_seconds={data_seconds}): `seconds` is the whole "
                    "step including the data wait, so data_seconds cannot exceed it"
                )
            self._sum_data_s += data_seconds
            self._sum_s_data_known += seconds
            self._n_data_known += 1
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
        self._thread.join(timeout=5 * self.interval + 5)
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
    def _read_cpu(self) -> tuple[float, float, float, float, float] | None:
        if self._tree is None:
            return None
        tree_s = self._tree.seconds()
        return (time.perf_counter(), *_system_cpu(), tree_s)

    def _read_run_queue(self) -> tuple[float, float] | None:
        """(CPU s, wait s) of this interval; also advances the run totals."""
        if self._rq is None or self._tree is None:
            return None
        now, prev = self._rq.read(self._tree.pids()), self._rq_last
        if now is None:
            return None
        self._rq_last = now
        return (now[0] - prev[0], now[1] - prev[1]) if prev is not None else None

    def _sample_gpu_processes(self) -> None:
        procs = self._gpu.processes()
        if procs is None:
            return
        ours = self._tree.pids() if self._tree is not None else {os.getpid()}
        visible = any(p in ours for p in procs)
        self._gpu_own_visible = visible if self._gpu_own_visible is None else (self._gpu_own_visible or visible)
        self._gpu_proc_samples += 1
        if visible:
            others = {p: mb for p, mb in procs.items() if p not in ours}
            for pid, mb in others.items():
                e = self._gpu_others.get(pid)
                if e is None:
                    try:
                        name = psutil.Process(pid).name()
                    except psutil.Error:
                        name = None
                    e = self._gpu_others[pid] = {"pid": pid, "name": name, "used_mb_max": mb}
                elif mb is not None:
                    e["used_mb_max"] = max(e["used_mb_max"] or 0.0, mb)
            self._gpu_other_counts.append(len(others))
        else:  # another PID namespace (container): assume one of the listed processes is ours
            self._gpu_other_counts.append(max(len(procs) - 1, 0))

    def _sample_once(self, last: dict[str, float]) -> None:
        now = time.perf_counter()
        vm = psutil.virtual_memory()
        try:
            rss = self._proc.memory_info().rss / _GB
        except psutil.Error:
            rss = float("nan")
        row: dict[str, Any] = {"t": now - (self._t0 or now), "ram_used_gb": (vm.total - vm.available) / _GB,
                               "rss_gb": rss}  # fmt: skip
        cpu, prev = self._read_cpu(), self._cpu_last
        if cpu is not None and prev is not None:
            d_total, dt = cpu[1] - prev[1], cpu[0] - prev[0]
            if d_total > 0 and dt > 0:
                ncpu = psutil.cpu_count(logical=True) or 1
                row["cpu_percent"] = 100.0 * (cpu[2] - prev[2]) / d_total
                row["proc_cpu_percent"] = 100.0 * (cpu[4] - prev[4]) / dt
                row["others_cores"] = max(0.0, row["cpu_percent"] / 100.0 * ncpu - row["proc_cpu_percent"] / 100.0)
            self._cpu_last = cpu
        rq = self._read_run_queue()
        if rq is not None and rq[0] + rq[1] > 0:
            row["cpu_wait_frac"] = rq[1] / (rq[0] + rq[1])
        if self._gpu is not None:
            row.update({f"gpu_{k}": v for k, v in self._gpu.sample().items()})
            try:
                self._sample_gpu_processes()
            except Exception:
                pass
        self._rows.append(row)
        # Throughput over the last interval, from counters the hot path already keeps (racy reads of
        # floats/ints are fine: a sample may be one step off).
        n_it, s_sum, smp = len(self._iter_s), self._sum_s, self._samples
        d_sum, dk_sum = self._sum_data_s, self._sum_s_data_known
        dt = now - last["t"]
        d_known = dk_sum - last["dk"]
        tl = {
            "t": row["t"],
            "iterations": float(n_it),
            "iters_per_s": (n_it - last["n"]) / dt if dt > 0 else 0.0,
            "samples_per_s": (smp - last["smp"]) / dt if dt > 0 and self._samples_known else float("nan"),
            "data_wait_frac": (d_sum - last["d"]) / d_known if d_known > 0 else float("nan"),
            "cpu_percent": row.get("cpu_percent", float("nan")),
        }
        if "gpu_util" in row:
            tl["gpu_util"] = row["gpu_util"] if row["gpu_util"] is not None else float("nan")
        self._timeline.append(tl)
        last.update(t=now, n=n_it, s=s_sum, d=d_sum, dk=dk_sum, smp=smp)

    def _scan_processes(self) -> dict | None:
        if not self.watch_other_processes:
            return None
        try:
            return _process_cpu_table()
        except Exception:  # an unreadable /proc must not stop the run
            return None

    def _run(self) -> None:
        c0 = time.thread_time()
        self._procs0 = self._scan_processes()
        last = {"t": self._t0 or time.perf_counter(), "n": 0, "s": 0.0, "d": 0.0, "dk": 0.0, "smp": 0}
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
        if self._procs0 is not None and self._cpu0 is not None:
            after = self._scan_processes()
            wall = time.perf_counter() - self._cpu0[0]
            if after is not None and wall > 0:
                ours = self._tree.pids() if self._tree is not None else {os.getpid()}
                self._others_top = _busiest_others(self._procs0, after, ours, self._t0_wall, wall)
        self._sampler_cpu_s = time.thread_time() - c0

    # ---- results
    def _cpu_summary(self) -> dict[str, Any]:
        """Whole-run CPU shares from the start and latest counters; None (and a reason) when too short."""
        out: dict[str, Any] = dict.fromkeys(
            (
                "cpu_percent_mean",
                "cpu_steal_percent_mean",
                "process_cpu_percent_mean",
                "cpu_others_cores_mean",
                "cpu_wait_frac",
                "cpu_wait_threads_mean",
            )
        )
        a, b = self._cpu0, self._cpu_last
        if a is None or b is None:
            out["_reason"] = "CPU use: psutil could not read the CPU counters"
            return out
        dt, d_total = b[0] - a[0], b[1] - a[1]
        if dt < _MIN_CPU_WINDOW_S or d_total <= 0:
            out["_reason"] = (
                f"CPU use: the sampled window was {dt:.3f} s, too short for the CPU counters (10 ms ticks); "
                f"needs at least {_MIN_CPU_WINDOW_S} s"
            )
            return out
        ncpu = psutil.cpu_count(logical=True) or 1
        busy = (b[2] - a[2]) / d_total
        proc_cores = (b[4] - a[4]) / dt
        out.update(
            cpu_percent_mean=100.0 * busy,
            cpu_steal_percent_mean=100.0 * (b[3] - a[3]) / d_total,
            process_cpu_percent_mean=100.0 * proc_cores,
            cpu_others_cores_mean=max(0.0, busy * ncpu - proc_cores),
        )
        rq = self._rq_last
        if rq is not None and rq[0] + rq[1] > 0:
            # share of the time this run's threads were ready to run that they spent waiting for a core, and
            # how many of them were waiting on average (what contention cost this run, in threads)
            out["cpu_wait_frac"] = rq[1] / (rq[0] + rq[1])
            out["cpu_wait_threads_mean"] = rq[1] / dt
        else:
            out["_reason_rq"] = "cpu_wait_frac: no run-queue counters (/proc/<pid>/task/*/schedstat, Linux only)"
        return out

    def get_summary(self) -> dict[str, Any]:
        """A JSON-serialisable dict; may be called while running (values so far).

        Anything that was not measured is None, and `not_measured` says why."""
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
        not_measured: list[str] = []

        def mean(key: str) -> float | None:
            vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
            return sum(vals) / len(vals) if vals else None

        def vmax(key: str) -> float | None:
            vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
            return max(vals) if vals else None

        if n == 0:
            not_measured.append("steps: log_iteration() was never called")
        known, known_s = self._n_data_known, self._sum_s_data_known
        data_wait = self._sum_data_s / known_s if known and known_s > 0 else None
        if n and not known:
            not_measured.append(
                "data_wait_frac: log_iteration() was called without data_seconds, so the time spent waiting "
                "for batches is unknown (not zero)"
            )
        elif known < n:
            not_measured.append(f"data_wait_frac covers {known} of {n} steps; the others had no data_seconds")
        samples_known = self._samples_known and n > 0
        if n and not self._samples_known:
            not_measured.append("samples_per_s: neither batch_size nor log_iteration(samples=...) was given")
        cpu = self._cpu_summary()
        for k in ("_reason", "_reason_rq"):
            if k in cpu:
                not_measured.append(cpu.pop(k))

        energy_j = self._gpu_energy_j
        energy_src: str | None = "nvml_energy_counter"
        if energy_j is None:
            p = mean("gpu_power_w")
            energy_j, energy_src = (p * wall, "mean_power_x_wall") if p is not None else (None, None)
        gpu_total = getattr(self._gpu, "total_mb", None)
        if gpu_total is None and self._is_cuda:
            gpu_total = torch.cuda.get_device_properties(self.device).total_memory / _MB
        gpu_procs_seen = self._gpu_proc_samples > 0
        if self._is_cuda and self._gpu is None:
            not_measured.append(
                "GPU utilisation, power, temperature, other GPU processes: no NVML (pip install nvidia-ml-py) "
                "and no nvidia-smi"
            )
        elif self._gpu is not None and not gpu_procs_seen:
            not_measured.append(f"other processes on the GPU: not reported by {self._gpu.name}")
        if self.watch_other_processes and self._others_top is None and self._t1 is not None:
            not_measured.append("busiest other processes: the process table could not be read")
        counts = self._gpu_other_counts
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
            "data_wait_frac": data_wait,
            "compute_frac": 1.0 - data_wait if data_wait is not None else None,
            "data_wait_measured_steps": known,
            "cpu_count_logical": psutil.cpu_count(logical=True),
            "cpu_usable_cores": usable_cpu_cores(),
            "process_cpu_scope": "this process and its children"
            if job_root_pid() == os.getpid()
            else "every local rank of this torchrun job (the launcher's process tree)",
            **cpu,
            "other_processes_cpu_top": self._others_top,
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
            "gpu_other_processes": list(self._gpu_others.values()) if gpu_procs_seen else None,
            "gpu_other_processes_max": max(counts) if counts else None,
            "gpu_other_process_frac": sum(1 for c in counts if c) / len(counts) if counts else None,
            "gpu_own_pid_visible": self._gpu_own_visible,
            "energy_kwh": energy_j / 3.6e6 if energy_j is not None else None,
            "energy_source": energy_src if energy_j is not None else None,
            "gpu_telemetry": getattr(self._gpu, "name", None),
            "sampler_interval_s": self.interval,
            "sampler_samples": len(rows),
            "sampler_cpu_s": self._sampler_cpu_s,
            "sampler_overhead_frac": self._sampler_cpu_s / wall if wall > 0 else None,
            "not_measured": not_measured,
        }

    def format_summary(self) -> str:
        """A few human-readable lines."""
        return format_summary(self.get_summary())

    def __enter__(self) -> TrainingMonitor:
        self.start_monitoring()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_monitoring()


def _fmt(v: float | None, spec: str, unit: str = "", what: str = "") -> str:
    """`v` with its unit, or "<what>not measured" (`what` names the figure when the unit would have)."""
    return f"{what}not measured" if v is None else f"{v:{spec}}{unit}"


def format_summary(s: dict[str, Any]) -> str:
    """Render a `TrainingMonitor.get_summary()` dict as a few lines."""
    it = s.get("iter_time_s") or {}
    ms = {k: (v * 1000 if v is not None else None) for k, v in it.items()}
    dw = s.get("data_wait_frac")
    lines = [
        f"steps {s.get('iterations', 0)} in {_fmt(s.get('wall_s'), '.1f', ' s')} | "
        f"{_fmt(s.get('samples_per_s'), '.1f', ' samples/s', 'samples/s ')} | "
        f"{_fmt(s.get('iters_per_s'), '.2f', ' it/s', 'it/s ')}",
        f"step time p50 {_fmt(ms.get('p50'), '.1f', ' ms')}, p90 {_fmt(ms.get('p90'), '.1f', ' ms')}, "
        f"p99 {_fmt(ms.get('p99'), '.1f', ' ms')} | data wait "
        + ("not measured" if dw is None else f"{100 * dw:.0f}% of step time"),
        f"CPU: whole machine {_fmt(s.get('cpu_percent_mean'), '.0f', '% busy')}, training process + workers "
        f"{_fmt(s.get('process_cpu_percent_mean'), '.0f', '% of a core')}, other processes "
        f"{_fmt(s.get('cpu_others_cores_mean'), '.1f', ' of ' + str(s.get('cpu_count_logical')) + ' cores')} | RAM max "
        f"{_fmt(s.get('ram_used_gb_max'), '.1f', ' GB')}",
    ]
    wait = s.get("cpu_wait_frac")
    if wait is not None:
        lines.append(
            f"this run's threads waited for a free core {100 * wait:.0f}% of the time they were ready to run "
            f"({s.get('cpu_wait_threads_mean') or 0:.2f} threads waiting on average)"
        )
    top = s.get("other_processes_cpu_top") or []
    if top:
        lines.append(
            "busiest other processes: "
            + ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_cores']:.1f} cores" for p in top)
        )
    if s.get("gpu_util_mean") is not None or s.get("peak_gpu_mem_mb") is not None:
        lines.append(
            f"GPU util {_fmt(s.get('gpu_util_mean'), '.0f', '%')}, power {_fmt(s.get('gpu_power_w_mean'), '.0f', ' W')}, "
            f"peak allocated {_fmt(s.get('peak_gpu_mem_mb'), '.0f', ' MB')} of "
            f"{_fmt(s.get('gpu_mem_total_mb'), '.0f', ' MB')}, energy {_fmt(s.get('energy_kwh'), '.4f', ' kWh')}"
        )
    if s.get("gpu_other_processes_max"):
        lines.append(
            f"other processes on the GPU: up to {s['gpu_other_processes_max']} "
            f"(in {100 * (s.get('gpu_other_process_frac') or 0):.0f}% of samples)"
        )
    ovh = s.get("sampler_overhead_frac")
    lines.append(
        f"monitor overhead {_fmt(None if ovh is None else 100 * ovh, '.2f', '% of one core')} "
        f"({s.get('sampler_samples', 0)} samples)"
    )
    lines += [f"not measured: {m}" for m in s.get("not_measured") or []]
    return "\n".join(lines)


def _self_check(seconds: float) -> None:
    """Time log_iteration, then watch a sleeping loop for `seconds` at 1 Hz and print the summary."""
    mon = TrainingMonitor(interval=1.0, batch_size=32)
    mon.start_monitoring()
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        mon.log_iteration(0.02, data_seconds=0.005)
    per_call_us = (time.perf_counter() - t0) / n * 1e6  # includes the loop's own cost
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(0.02)
    mon.stop_monitoring()
    print(mon.format_summary())
    print(f"log_iteration: {per_call_us:.2f} µs per call (loop included)")


if __name__ == "__main__":  # self-check: python -m utils.performance_monitor [SECONDS, default 3]
    import sys

    _self_check(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
