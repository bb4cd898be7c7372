"""utils.system_report: hardware info, Markdown rendering, and a full measured report from a stand-in trainer.

Run as a script to regenerate the example under docs/ (until the engine's `--system_report` replaces it):
    .venv/bin/python tests/test_system_report.py docs/system_report_cpu.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(ROOT))

from utils.performance_monitor import TrainingMonitor  # noqa: E402
from utils.system_report import (  # noqa: E402
    cpu_frequencies,
    hardware_info,
    judge,
    nvml_clocks,
    project_job,
    render_hardware,
    render_report,
    run_system_report,
)

STANDIN_NOTE = (
    "STAND-IN EXAMPLE: measured with a small hand-written loop (3-layer CNN on synthetic 4°-grid SST-like "
    "fields, a dataset that sleeps {ms} ms per sample to imitate reading a netCDF file per sample) from "
    "tests/test_system_report.py, not with plainloop's engine. `python train_optimized.py --system_report` "
    "regenerates this page from the real trainer."
)


class FieldDataset(Dataset):
    """SST-like (2, 40, 90) input (4° grid) -> (1, 40, 90) target; `read_ms` of sleep per sample unless cached."""

    def __init__(self, n: int = 512, read_ms: float = 2.0, cached: bool = False) -> None:
        rng = np.random.default_rng(0)
        lat = np.linspace(-78, 78, 40)[:, None]
        base = 28 * np.cos(np.deg2rad(lat)) ** 2 * np.ones((40, 90))
        self.x = (base[None] + rng.standard_normal((n + 2, 40, 90))).astype("f4")
        self.n, self.read_ms, self.cached = n, read_ms, cached

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.cached:
            time.sleep(self.read_ms / 1000)  # imitates opening + decoding a netCDF file per sample
        return torch.from_numpy(self.x[i : i + 2]), torch.from_numpy(self.x[i + 2 : i + 3])


def make_standin_run_trial(base: dict, read_ms: float):
    """run_trial(overrides, steps) the way the engine will provide it, built from a hand loop."""
    cache: dict[bool, FieldDataset] = {}

    def run_trial(overrides: dict, steps: int) -> dict:
        s = {**base, **overrides}
        cached = bool(s.get("cache"))
        ds = cache.setdefault(cached, FieldDataset(read_ms=read_ms, cached=cached))
        nw = int(s["num_workers"])
        loader = DataLoader(ds, batch_size=int(s["batch_size"]), shuffle=True, num_workers=nw,
                            persistent_workers=nw > 0, drop_last=True)  # fmt: skip
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 16, 3, padding=1), nn.GELU(), nn.Conv2d(16, 16, 3, padding=1), nn.GELU(),
                              nn.Conv2d(16, 1, 3, padding=1))  # fmt: skip
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        bf16 = s.get("precision") == "bf16"

        def batches():
            while True:
                yield from loader

        it = batches()

        def step(timed: TrainingMonitor | None) -> None:
            t0 = time.perf_counter()
            x, y = next(it)
            t1 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if timed is not None:
                timed.log_iteration(time.perf_counter() - t0, data_seconds=t1 - t0, samples=x.shape[0])

        for _ in range(2):  # warm-up (worker start-up, allocator) stays out of the measurement
            step(None)
        mon = TrainingMonitor(interval=0.5, batch_size=int(s["batch_size"]))
        mon.start_monitoring()
        for _ in range(steps):
            step(mon)
        mon.stop_monitoring()
        summ = mon.get_summary()
        return {
            "samples_per_s": summ["samples_per_s"],
            "data_wait_frac": summ["data_wait_frac"],
            "step_time_ms": 1000 * summ["iter_time_s"]["p50"],
            "peak_mem_mb": None,
            "monitor": summ,
            "device_type": "cpu",
            "step_stats": {"num_workers": nw, "torch_threads": torch.get_num_threads()},
        }

    return run_trial


CANDIDATES = [
    {"name": "2 loader workers", "overrides": {"num_workers": 2}},
    {"name": "dataset cached in RAM", "overrides": {"cache": True}},
    {"name": "batch 64", "overrides": {"batch_size": 64}},  # relevant to launch/memory verdicts only
    {"name": "bf16 autocast", "overrides": {"precision": "bf16"}},
]


def generate(out: Path, steps: int, read_ms: float, batch_size: int = 16, repeats: int = 1) -> Path:
    base = {"batch_size": batch_size, "num_workers": 0, "precision": "fp32", "cache": False}
    cfg = {
        "note": STANDIN_NOTE.format(ms=read_ms),
        "command": f"python tests/test_system_report.py {out}",
        "task": "stand-in SST-like CNN",
        **base,
    }
    return run_system_report(make_standin_run_trial(base, read_ms), base, CANDIDATES, steps, out, cfg, repeats=repeats)


# --------------------------------------------------------------------------- tests
def test_hardware_info_and_cli() -> None:
    hw = hardware_info()
    for key in (
        "cpu_model",
        "cpu_physical_cores",
        "cpu_logical_cores",
        "ram_total_gb",
        "gpus",
        "torch",
        "python",
        "os",
    ):
        assert key in hw
    assert hw["torch"] == torch.__version__ and hw["cpu_logical_cores"] >= 1
    md = render_hardware(hw)
    assert "| CPU |" in md and "| RAM |" in md
    res = subprocess.run([sys.executable, "-m", "utils.system_report"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "## Hardware" in res.stdout and hw["cpu_model"] in res.stdout


def test_render_report_judges_against_the_noise() -> None:
    hw = {
        "cpu_model": "Test CPU",
        "cpu_physical_cores": 4,
        "cpu_logical_cores": 8,
        "ram_total_gb": 32,
        "gpus": [],
    }
    trials = [
        {"name": "your settings", "overrides": {}, "samples_per_s": 100.0, "samples_per_s_reps": [100.0, 96.0, 104.0],
         "data_wait_frac": 0.6, "step_time_ms": 160.0},
        {"name": "4 workers", "overrides": {"num_workers": 4}, "samples_per_s": 250.0,
         "samples_per_s_reps": [250.0, 240.0, 260.0], "data_wait_frac": 0.05, "step_time_ms": 64.0},
        {"name": "in memory", "overrides": {"device_cache": False}, "samples_per_s": 103.0,
         "samples_per_s_reps": [103.0, 98.0, 105.0]},
        {"name": "batch 512", "overrides": {"batch_size": 512}, "error": "OutOfMemoryError: CUDA out of memory"},
    ]  # fmt: skip
    verdict = {
        "verdict": "data-loading bound",
        "evidence": ["60% waiting"],
        "advice": "more workers",
        "notes": [],
    }
    md = render_report(hw, {"batch_size": 16, "repeats": 3}, {"iterations": 10}, verdict, trials)
    assert "## Verdict: **data-loading bound**" in md
    assert "1. **num_workers=4** — 2.50× your samples/s" in md
    assert "| 4 workers: num_workers=4 | 250.0 (240–260) | 2.50× | faster |" in md
    assert "**No difference** (inside the noise: yours ranged 96.0–104.0" in md and "device_cache=False (1.03×)" in md
    assert "2. **" not in md, "a difference inside the noise is never a recommendation"
    assert "failed: OutOfMemoryError" in md
    # one repetition: nothing is judged, nothing recommended (issue 11: a 1.54x from noise was recommended)
    single = [dict(t, samples_per_s_reps=None) for t in trials]
    md1 = render_report(hw, {"repeats": 1}, {}, verdict, single)
    assert "1. **" not in md1 and "Nothing measured here was faster" in md1
    assert "**Not judged** (one run each: no noise estimate; run with --report_repeats 3" in md1


def test_before_after_table_names_each_setting_once() -> None:
    """The "settings" and "changed" columns repeated each other on every single-setting row."""
    hw = {"cpu_model": "Test CPU", "cpu_logical_cores": 2, "ram_total_gb": 8, "gpus": []}
    trials = [
        {"name": "your settings", "overrides": {}, "samples_per_s": 100.0, "samples_per_s_reps": [100.0, 99.0, 101.0]},
        {"name": "batch_size=64", "overrides": {"batch_size": 64}, "samples_per_s": 90.0,
         "samples_per_s_reps": [90.0, 89.0, 91.0]},
        {"name": "combined", "overrides": {"batch_size": 64, "num_workers": 2}, "samples_per_s": 95.0,
         "samples_per_s_reps": [95.0, 94.0, 96.0]},
        {"name": "num_workers=4", "overrides": {"num_workers": 4}, "error": "RuntimeError: boom"},
    ]  # fmt: skip
    md = render_report(hw, {"repeats": 3}, {}, {"verdict": "compute bound", "evidence": [], "advice": ""}, trials)
    assert "| settings | samples/s | vs yours | judged |" in md and "| changed |" not in md
    assert "| your settings | 100.0 (99–101) | 1.00× | — |" in md
    assert "| batch_size=64 | 90.0 (89–91) | 0.90× | slower |" in md
    assert "| combined: batch_size=64, num_workers=2 | 95.0 (94–96) | 0.95× | slower |" in md
    assert "| num_workers=4 | failed: RuntimeError: boom |" in md


def test_the_before_after_heading_counts_the_rows_and_timings_of_its_table() -> None:
    """A heading that said "median of 3 interleaved runs" above a table of 2 rows read as a count of rows."""
    hw = {"cpu_model": "Test CPU", "cpu_logical_cores": 2, "ram_total_gb": 8, "gpus": []}
    verdict = {"verdict": "compute bound", "evidence": [], "advice": ""}
    trials = [
        {"name": "your settings", "overrides": {}, "samples_per_s": 100.0, "samples_per_s_reps": [100.0, 99.0, 101.0]},
        {"name": "batch_size=64", "overrides": {"batch_size": 64}, "samples_per_s": 90.0,
         "samples_per_s_reps": [90.0, 89.0, 91.0]},
    ]  # fmt: skip
    config = {"repeats": 3, "steps_per_trial": 20}
    md = render_report(hw, config, {}, verdict, trials)
    heading = next(line for line in md.splitlines() if line.startswith("## Before / after"))
    table = md.split(heading, 1)[1].strip().split("\n\n", 1)[0].splitlines()  # up to the first blank line
    assert len(table) - 2 == 2 and "the 2 settings below" in heading, (heading, table)
    assert "each timed 3 times" in heading and "runs" not in heading
    trials[0]["samples_per_s_reps"].append(100.5)  # yours timed once more beside a combined candidate
    assert "each timed 3 to 4 times" in render_report(hw, config, {}, verdict, trials)


def test_judge_and_project_job() -> None:
    assert judge([100, 104, 98], [150, 149, 155]) == "faster"
    assert judge([100, 104, 98], [90, 95, 97]) == "slower"
    assert judge([100, 104, 98], [101, 97, 103]) == "no difference"
    assert judge([100], [154]) == "not judged"
    pj = project_job(100.0, 3.6e6, power_w=300.0, price_per_kwh=0.5, price_per_gpu_hour=2.0, gpus=2)
    assert pj["hours"] == pytest.approx(10.0) and pj["kwh"] == pytest.approx(3.0)
    assert pj["cost"] == pytest.approx(10 * 2 * 2.0 + 3.0 * 0.5)
    assert project_job(100.0, 3.6e6) == {"hours": pytest.approx(10.0), "kwh": None, "cost": None}
    assert project_job(None, 3.6e6)["hours"] is None


@pytest.fixture
def no_rapl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripted reports must not pick up this machine's real CPU power counter."""
    import utils.system_report as sr

    monkeypatch.setattr(sr, "_rapl_uj", lambda: None)


def _scripted_trial(table: dict[str, list[float]], trial_dir: Path, until: threading.Event | None = None):
    """run_trial that returns scripted samples/s per setting and writes a run folder with a checkpoint,
    as the engine's trials do; `until`: an event the trial waits for (what a real trial would measure around it)."""
    calls: dict[str, int] = {}

    def run_trial(overrides: dict, steps: int) -> dict:
        key = ",".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "base"
        i = calls.get(key, 0)
        calls[key] = i + 1
        d = trial_dir / f"trial-{key}-{i}" / "checkpoints"
        d.mkdir(parents=True)
        (d / "last.pt").write_bytes(b"x" * 1000)
        if until is not None:
            assert until.wait(600), "the report's sampler never sampled"
        sps = table[key][i % len(table[key])]
        mon = {"samples_per_s": sps, "data_wait_frac": 0.01, "iter_time_s": {"p50": 0.1, "p90": 0.11},
               "iterations": steps}  # fmt: skip
        return {"samples_per_s": sps, "data_wait_frac": 0.01, "step_time_ms": 100.0, "peak_mem_mb": None,
                "monitor": mon, "device_type": "cpu"}  # fmt: skip

    return run_trial


def test_priority_list_projection_and_trial_cleanup(tmp_path: Path, no_rapl: None) -> None:
    trials = tmp_path / "run" / "trials"
    # the scripted monitor reads as compute bound: every candidate below is relevant to that verdict
    table = {"base": [100.0, 104.0, 98.0, 101.0, 99.0, 102.0], "compile_model=True": [150.0, 149.0, 155.0],
             "channels_last=True": [101.0, 97.0, 103.0], "precision=bf16": [120.0, 125.0, 122.0],
             "compile_model=True,precision=bf16": [170.0, 172.0, 175.0]}  # fmt: skip
    cands = [{"compile_model": True}, {"channels_last": True}, {"precision": "bf16"}]
    out = run_system_report(_scripted_trial(table, trials), {"batch_size": 32}, cands, 5, tmp_path / "run" / "report.md",
                            {"task": "scripted", "hardware": {"cpu_model": "x", "gpus": []}}, repeats=3,
                            job_samples=3.6e6, price_per_gpu_hour=2.0, power_w=250.0, price_per_kwh=0.3,
                            currency="EUR", trial_dir=trials)  # fmt: skip
    md = out.read_text()
    raw = json.loads(out.with_suffix(".json").read_text())
    assert not trials.exists(), "trial folders and their checkpoints are removed"
    assert out.exists() and out.with_suffix(".json").exists()
    judged = {t["name"]: t["judgement"] for t in raw["trials"][1:]}
    assert judged == {"compile_model=True": "faster", "channels_last=True": "no difference",
                      "precision=bf16": "faster", "combined": "faster"}  # fmt: skip
    lines = md.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("1. **"))
    assert lines[first].startswith("1. **precision=bf16, compile_model=True** — 1.72×"), lines[first]
    assert lines[first + 1].startswith("2. **compile_model=True** — 1.50×")
    assert lines[first + 2].startswith("3. **precision=bf16** — 1.22×")
    assert "the configured job: 6.67 h instead of 10.00 h, 13.83 EUR instead of 20.75 EUR" in lines[first + 1]
    assert "| your settings | 100.0 | 10.00 | 250 | 2.500 | 20.75 EUR |" in md  # 10 h x 2 + 2.5 kWh x 0.3
    assert "assumed 250 W for the whole machine (power_w), not measured" in md
    assert "channels_last=True (1.01×)" in md and "trial folders removed" in md
    assert "Prices: 0.3 EUR per kWh, 2 EUR per machine hour." in md
    with pytest.raises(ValueError, match="contains the report"):
        run_system_report(_scripted_trial(table, trials), {}, [], 5, tmp_path / "run" / "report.md", {},
                          trial_dir=tmp_path / "run")  # fmt: skip
    with pytest.raises(ValueError, match="price_per_kwh"):
        run_system_report(_scripted_trial(table, trials), {}, [], 5, tmp_path / "r.md", {}, price_per_kwh=-1)


def test_job_size_can_come_from_the_first_trial(tmp_path: Path, no_rapl: None) -> None:
    inner = _scripted_trial({"base": [100.0]}, tmp_path / "t")
    out = run_system_report(lambda ov, n: {**inner(ov, n), "job_samples": 720_000}, {}, [], 5, tmp_path / "r.md",
                            {"hardware": {"cpu_model": "x", "gpus": []}}, price_per_gpu_hour=3.0)  # fmt: skip
    assert "| your settings | 100.0 | 2.00 | n/a | n/a | 6.00 |" in out.read_text()
    assert "not measured on this machine" in out.read_text()


def test_rapl_power_is_measured_around_a_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import utils.system_report as sr

    readings = iter([(1e6, 2e12), (1e6 + 30e6, 2e12)])  # 30 J over the trial
    monkeypatch.setattr(sr, "_rapl_uj", lambda: next(readings))
    clock = iter([10.0, 12.0])  # the trial's start and end
    monkeypatch.setattr(sr, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    m = sr._measured_trial(lambda ov, n: {"samples_per_s": 1.0}, {}, 2)
    assert m["cpu_package_w"] == pytest.approx(30 / 2.0) and m["trial_wall_s"] == 2.0


def test_trial_dir_removed_after_a_failure(tmp_path: Path) -> None:
    trials = tmp_path / "trials"

    def broken(overrides: dict, steps: int) -> dict:
        (trials / "t1" / "checkpoints").mkdir(parents=True)
        raise RuntimeError("diverged")

    with pytest.raises(RuntimeError, match="diverged"):
        run_system_report(broken, {}, [], 5, tmp_path / "report.md", {}, trial_dir=trials)
    assert not trials.exists()


class _FakeNvml:
    """Just enough of pynvml for the report: utilisation, process utilisation, clocks."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self) -> None:
        self.sampled = threading.Event()

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=80, memory=35)

    def nvmlDeviceGetProcessUtilization(self, h: str, ts: int) -> list[SimpleNamespace]:
        self.sampled.set()  # the sampler's row is complete once this returns
        return [SimpleNamespace(pid=os.getpid(), smUtil=70, memUtil=30, timeStamp=ts + 1),
                SimpleNamespace(pid=-5, smUtil=99, memUtil=99, timeStamp=ts + 1)]  # fmt: skip

    def nvmlDeviceGetClockInfo(self, h: str, clk: int) -> int:
        return 1755 if clk == 1 else 2619

    def nvmlDeviceGetMaxClockInfo(self, h: str, clk: int) -> int:
        return 1980 if clk == 1 else 2619

    def nvmlDeviceGetDefaultApplicationsClock(self, h: str, clk: int) -> int:
        return 1590


def test_nvml_utilisation_and_clocks_with_a_mocked_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_clocks() == [{"index": 0, "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980, "sm_clock_base_mhz": 1590,
                              "mem_clock_mhz": 2619, "mem_clock_max_mhz": 2619}]  # fmt: skip
    hw = {"cpu_model": "x", "gpus": [{"index": 0, "name": "H100", "memory_gb": 80, **nvml_clocks()[0]}]}
    assert "| GPU 0 clocks (NVML) | SM base 1590 MHz, SM now 1755 MHz, SM max 1980 MHz" in render_hardware(hw)
    table = {"base": [100.0]}
    out = run_system_report(_scripted_trial(table, tmp_path / "t", until=fake.sampled), {}, [], 5, tmp_path / "r.md",
                            {"hardware": hw})  # fmt: skip
    raw = json.loads(out.with_suffix(".json").read_text())
    nv = raw["profile"]["nvml"]
    assert nv["gpu_busy_pct"] == 80 and nv["mem_ctrl_pct"] == 35 and nv["process_sm_pct"] == 70
    assert nv["util_samples"] >= 1
    assert "memory controller busy 35%" in out.read_text()


def test_cpu_frequencies(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "cpu_freq", lambda: SimpleNamespace(current=2400.0, min=800.0, max=4400.0))
    f = cpu_frequencies("12th Gen Intel(R) Core(TM) i5-12400 @ 2.50GHz")
    assert f["cpu_current_mhz"] == 2400.0 and f["cpu_max_mhz"] == 4400.0
    if not Path("/sys/devices/system/cpu/cpu0/cpufreq/base_frequency").exists():
        assert f["cpu_base_mhz"] == 2500.0  # from the model name
    assert "| CPU frequency | " in render_hardware({"cpu_model": "x", "gpus": [], **f})


def test_run_system_report_with_standin_trainer(tmp_path: Path) -> None:
    out = generate(tmp_path / "report" / "system_report.md", steps=3, read_ms=100.0, batch_size=4)
    md = out.read_text()
    raw = json.loads(out.with_suffix(".json").read_text())
    assert (
        raw["verdict"]["verdict"] == "data-loading bound"
    )  # 400 ms of "reading" per step, 0 workers: robust to a busy CPU
    names = [t["name"] for t in raw["trials"]]
    assert names[0] == "your settings"
    # only candidates relevant to a data-loading verdict were measured (plus maybe their combination)
    assert set(names[1:]) <= {"2 loader workers", "dataset cached in RAM", "combined"}
    assert all(t.get("samples_per_s", 0) > 0 for t in raw["trials"] if "error" not in t)
    assert "STAND-IN EXAMPLE" in md and "## Before / after" in md and "## Hardware" in md
    assert "**Not judged**" in md and "1. **" not in md  # one repetition: no recommendation
    assert len(md.splitlines()) < 80  # readable in under a minute


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "system_report_cpu.md"
    print(generate(target, steps=20, read_ms=5.0, repeats=3).read_text())


def test_small_jobs_read_in_minutes_and_held_data_is_not_a_candidate(tmp_path: Path, no_rapl: None) -> None:
    """A CLI report of a short job said "the configured job: 0.00 h instead of 0.00 h"; and with the data
    already held in memory (device_cache auto) it measured and recommended "device_cache=True" as 1.06x faster,
    which is the user's own setting again (noise); "pass power_w" named no flag."""
    from tasks.cli_tools import _report_candidates
    from trainer import TrainConfig
    from utils.system_report import _duration

    assert [_duration(h) for h in (6.666, 0.05, 0.001)] == ["6.67 h", "3.0 min", "3.6 s"]
    trials = tmp_path / "run" / "trials"
    table = {"base": [100.0, 104.0, 98.0], "compile_model=True": [150.0, 149.0, 155.0]}
    out = run_system_report(_scripted_trial(table, trials), {"batch_size": 32}, [{"compile_model": True}], 5,
                            tmp_path / "run" / "report.md", {"task": "scripted", "hardware": {"cpu_model": "x"}},
                            repeats=3, job_samples=3600, trial_dir=trials)  # fmt: skip
    md = out.read_text()
    assert "the configured job: 24.0 s instead of 36.0 s" in md and "0.00 h" not in md
    assert "| your settings | 100.0 | 0.01 |" in md
    assert "pass --power_w" in md
    cfg = TrainConfig(batch_size=32)
    assert {"device_cache": True, "num_workers": 0} in _report_candidates(cfg, held=False)
    assert not any(c.get("device_cache") is True for c in _report_candidates(cfg, held=True))
    assert {"device_cache": False, "num_workers": 2} in _report_candidates(cfg, held=True)
