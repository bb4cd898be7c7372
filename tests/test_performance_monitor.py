"""TrainingMonitor, diagnose() and profile_steps(): seed 001's snippet, real slow/fast loaders, mocked NVML."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from utils import performance_monitor as pm
from utils.bottleneck import THRESHOLDS, VERDICTS, diagnose
from utils.performance_monitor import TrainingMonitor, percentile


def test_seed_001_snippet_runs(capsys: pytest.CaptureFixture[str]) -> None:
    monitor = TrainingMonitor()
    monitor.start_monitoring()
    for _ in range(3):
        start_time = time.time()
        sum(i * i for i in range(1000))  # ... training code ...
        iteration_time = time.time() - start_time
        monitor.log_iteration(iteration_time)
    monitor.stop_monitoring()
    print(monitor.get_summary())
    out = capsys.readouterr().out
    assert "iter_time_s" in out and "samples_per_s" in out
    s = monitor.get_summary()
    assert s["iterations"] == 3 and s["samples"] is None  # no batch size given: samples unknown, not invented
    json.dumps(s)  # JSON-serialisable, for summary.json


def test_summary_fields_and_percentiles() -> None:
    mon = TrainingMonitor(interval=0.05, batch_size=4, warmup_iters=1)
    mon.start_monitoring()
    times = [0.5] + [0.01 * (i + 1) for i in range(10)]  # a slow first (warm-up) step, then 10..100 ms
    for t in times:
        mon.log_iteration(t, data_seconds=t / 4)
    time.sleep(0.15)
    mon.stop_monitoring()
    s = mon.get_summary()
    steady = sorted(times[1:])
    assert s["iter_time_s"]["p50"] == pytest.approx(percentile(steady, 50))
    assert s["iter_time_s"]["max"] == pytest.approx(max(steady))  # warm-up step excluded
    assert s["samples"] == 4 * len(times)
    assert s["samples_per_s"] == pytest.approx(4 * len(times) / sum(times))
    assert s["data_wait_frac"] == pytest.approx(0.25)
    assert s["compute_frac"] == pytest.approx(0.75)
    assert s["sampler_samples"] >= 1 and 0.0 <= s["sampler_overhead_frac"]
    assert s["peak_gpu_mem_mb"] is None and s["gpu_util_mean"] is None and s["energy_kwh"] is None
    assert s["ram_used_gb_max"] > 0 and s["cpu_percent_mean"] is not None
    assert mon.get_timeline() and "samples_per_s" in mon.get_timeline()[0]
    assert "samples/s" in mon.format_summary()


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="interval"):
        TrainingMonitor(interval=0)
    with pytest.raises(ValueError, match="batch_size"):
        TrainingMonitor(batch_size=0)
    mon = TrainingMonitor()
    with pytest.raises(ValueError, match="cannot exceed"):
        mon.log_iteration(0.1, data_seconds=0.2)
    with pytest.raises(ValueError, match=">= 0"):
        mon.log_iteration(-1.0)
    mon.start_monitoring()
    with pytest.raises(RuntimeError, match="twice"):
        mon.start_monitoring()
    mon.stop_monitoring()
    mon.stop_monitoring()  # idempotent
    with pytest.raises(ValueError, match="device_type"):
        diagnose({}, device_type="tpu")


# --------------------------------------------------------------------------- real loops
class SlowDataset(Dataset):
    """Each sample costs 4 ms of I/O-like waiting (like reading a netCDF file per sample)."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.004)
        return torch.randn(16), torch.randn(1)


def _train(loader: DataLoader, model: nn.Module, steps: int) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon = TrainingMonitor(interval=0.1)
    mon.start_monitoring()
    it = iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mon.log_iteration(time.perf_counter() - t0, data_seconds=t1 - t0, samples=x.shape[0])
    mon.stop_monitoring()
    return mon.get_summary()


def test_slow_dataset_is_data_loading_bound() -> None:
    torch.manual_seed(0)
    s = _train(DataLoader(SlowDataset(), batch_size=8), nn.Linear(16, 1), steps=8)
    v = diagnose(s, device_type="cpu", step_stats={"num_workers": 0})
    assert v["verdict"] == "data-loading bound"
    assert s["data_wait_frac"] >= THRESHOLDS["data_wait_frac"]
    assert "num_workers" in v["advice"] and v["evidence"]


def test_in_memory_heavier_model_is_not_data_bound() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 256), torch.randn(512, 1))
    model = nn.Sequential(
        nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1)
    )
    s = _train(DataLoader(data, batch_size=64), model, steps=8)
    v = diagnose(s, device_type="cpu")
    assert v["verdict"] in VERDICTS and v["verdict"] != "data-loading bound"
    assert any("CPU run" in n for n in v["notes"])  # honest about what a CPU run can tell


# --------------------------------------------------------------------------- GPU verdicts (synthetic summaries)
def _gpu_summary(**kw: float) -> dict:
    s = {"iter_time_s": {"p50": 0.05, "p90": 0.06}, "samples_per_s": 1000.0, "data_wait_frac": 0.02,
         "gpu_util_mean": 95.0, "peak_gpu_mem_mb": 20_000.0, "gpu_mem_total_mb": 80_000.0, "gpu_alloc_retries": 0,
         "gpu_power_w_mean": 600.0, "gpu_power_limit_w": 700.0}  # fmt: skip
    s.update(kw)
    return s


def test_gpu_verdicts() -> None:
    assert diagnose(_gpu_summary(), device_type="cuda")["verdict"] == "compute bound"
    assert diagnose(_gpu_summary(data_wait_frac=0.5, gpu_util_mean=30.0), device_type="cuda")["verdict"] == (
        "data-loading bound"
    )
    assert diagnose(_gpu_summary(peak_gpu_mem_mb=78_000.0), device_type="cuda")["verdict"] == "memory bound"
    assert diagnose(_gpu_summary(gpu_alloc_retries=3), device_type="cuda")["verdict"] == "memory bound"
    v = diagnose(_gpu_summary(gpu_util_mean=25.0, iter_time_s={"p50": 0.004, "p90": 0.005}), device_type="cuda",
                 step_stats={"kernels_per_step": 900, "syncs_per_step": 3})  # fmt: skip
    assert v["verdict"] == "host/launch bound" and "sync" in v["advice"]
    v = diagnose(_gpu_summary(gpu_util_mean=90.0), device_type="cuda", step_stats={"elementwise_frac": 0.7})
    assert v["verdict"] == "memory bound" and "compile" in v["advice"]


# --------------------------------------------------------------------------- NVML path, mocked
def _fake_pynvml(calls: list[str]) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0
    energy = {"mj": 1_000_000.0}

    def rec(name, value):
        def f(*a):
            calls.append(name)
            return value() if callable(value) else value

        return f

    def tick_energy():
        energy["mj"] += 250_000.0  # 250 J between reads
        return energy["mj"]

    nv.nvmlInit = rec("init", None)
    nv.nvmlShutdown = rec("shutdown", None)
    nv.nvmlDeviceGetHandleByIndex = rec("handle", "H0")
    nv.nvmlDeviceGetHandleByPciBusId = rec("handle_pci", "H0")
    nv.nvmlDeviceGetMemoryInfo = rec("mem", types.SimpleNamespace(total=80 * 1024**3, used=30 * 1024**3))
    nv.nvmlDeviceGetEnforcedPowerLimit = rec("plimit", 700_000)
    nv.nvmlDeviceGetTotalEnergyConsumption = rec("energy", tick_energy)
    nv.nvmlDeviceGetUtilizationRates = rec("util", types.SimpleNamespace(gpu=87, memory=40))
    nv.nvmlDeviceGetPowerUsage = rec("power", 350_000)
    nv.nvmlDeviceGetTemperature = rec("temp", 61)
    return nv


def test_nvml_path_mocked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    # Pretend CUDA is there: allocator counters answer with fixed values.
    monkeypatch.setattr(TrainingMonitor, "_is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # backend falls back to index lookup
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 12 * 1024**3)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 14 * 1024**3)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda d=None: {"num_alloc_retries": 0})
    mon = TrainingMonitor(interval=0.05, device=torch.device("cuda", 0), batch_size=32)
    mon.start_monitoring()
    for _ in range(5):
        mon.log_iteration(0.02, data_seconds=0.001)
    time.sleep(0.2)
    mon.stop_monitoring()
    s = mon.get_summary()
    assert s["gpu_telemetry"] == "nvml"
    assert s["gpu_util_mean"] == pytest.approx(87.0)
    assert s["gpu_power_w_mean"] == pytest.approx(350.0) and s["gpu_power_limit_w"] == pytest.approx(700.0)
    assert s["gpu_temp_c_max"] == pytest.approx(61.0)
    assert s["peak_gpu_mem_mb"] == pytest.approx(12 * 1024) and s["gpu_mem_total_mb"] == pytest.approx(
        80 * 1024
    )
    assert s["energy_source"] == "nvml_energy_counter"
    assert s["energy_kwh"] == pytest.approx(250.0 / 3.6e6)  # counter delta between start and stop
    assert "shutdown" in calls
    assert "GPU util 87%" in mon.format_summary()
    v = diagnose(s, device_type="cuda")
    assert v["verdict"] == "compute bound" and any("87%" in e for e in v["evidence"])


def test_nvidia_smi_fallback_parsing() -> None:
    p = pm._SmiBackend.parse_line("93, 40200, 81559, 412.35, 64\n")
    assert p == {
        "util": 93.0,
        "mem_used_mb": 40200.0,
        "mem_total_mb": 81559.0,
        "power_w": 412.35,
        "temp_c": 64.0,
    }
    assert pm._SmiBackend.parse_line("12, 100, 8188, [N/A], 42")["power_w"] is None
    assert pm._SmiBackend.parse_line("garbage") == {}


def test_no_gpu_backend_without_nvml_or_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setattr(pm.shutil, "which", lambda name: None)
    assert pm._open_gpu_backend(0, 1.0) is None


# --------------------------------------------------------------------------- profiler
def test_profile_steps_writes_trace_and_table(tmp_path: Path) -> None:
    from utils.profiling import profile_steps

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randn(16, 1)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    r = profile_steps(step, tmp_path / "prof", steps=2, warmup=1)
    trace = json.loads(Path(r["trace"]).read_text())
    assert trace["traceEvents"]
    table = Path(r["table"]).read_text()
    assert "| op |" in table and "aten::" in table
    assert r["kernels_per_step"] > 0 and r["syncs_per_step"] == 0
    assert r["top_ops"] and all("ProfilerStep" not in o["name"] for o in r["top_ops"])
