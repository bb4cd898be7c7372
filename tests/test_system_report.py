"""utils.system_report: hardware info, Markdown rendering, and a full measured report from a stand-in trainer.

Run as a script to regenerate the example under docs/ (until the engine's `--system_report` replaces it):
    .venv/bin/python tests/test_system_report.py docs/system_report_cpu.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(ROOT))

from utils.performance_monitor import TrainingMonitor  # noqa: E402
from utils.system_report import hardware_info, render_hardware, render_report, run_system_report  # noqa: E402

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
    return run_system_report(
        make_standin_run_trial(base, read_ms), base, CANDIDATES, steps, out, cfg, repeats=repeats
    )


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
    res = subprocess.run(
        [sys.executable, "-m", "utils.system_report"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0 and "## Hardware" in res.stdout and hw["cpu_model"] in res.stdout


def test_render_report_table_and_ratio() -> None:
    hw = {
        "cpu_model": "Test CPU",
        "cpu_physical_cores": 4,
        "cpu_logical_cores": 8,
        "ram_total_gb": 32,
        "gpus": [],
    }
    trials = [
        {"name": "your settings", "overrides": {}, "samples_per_s": 100.0, "data_wait_frac": 0.6, "step_time_ms": 160.0},
        {"name": "4 workers", "overrides": {"num_workers": 4}, "samples_per_s": 250.0, "data_wait_frac": 0.05,
         "step_time_ms": 64.0},
        {"name": "batch 512", "overrides": {"batch_size": 512}, "error": "OutOfMemoryError: CUDA out of memory"},
    ]  # fmt: skip
    verdict = {
        "verdict": "data-loading bound",
        "evidence": ["60% waiting"],
        "advice": "more workers",
        "notes": [],
    }
    md = render_report(hw, {"batch_size": 16}, {"iterations": 10}, verdict, trials)
    assert "## Verdict: **data-loading bound**" in md
    assert "| 4 workers | num_workers=4 | 250.0 | 2.50× |" in md
    assert "failed: OutOfMemoryError" in md
    assert "**Recommended:** num_workers=4" in md


def test_run_system_report_with_standin_trainer(tmp_path: Path) -> None:
    out = generate(tmp_path / "report" / "system_report.md", steps=4, read_ms=10.0, batch_size=8)
    md = out.read_text()
    raw = json.loads(out.with_suffix(".json").read_text())
    assert raw["verdict"]["verdict"] == "data-loading bound"  # 80 ms of "reading" per step, 0 workers
    names = [t["name"] for t in raw["trials"]]
    assert names[0] == "your settings"
    # only candidates relevant to a data-loading verdict were measured (plus maybe their combination)
    assert set(names[1:]) <= {"2 loader workers", "dataset cached in RAM", "combined"}
    assert all(t.get("samples_per_s", 0) > 0 for t in raw["trials"] if "error" not in t)
    assert "STAND-IN EXAMPLE" in md and "## Before / after" in md and "## Hardware" in md
    assert len(md.splitlines()) < 80  # readable in under a minute


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "system_report_cpu.md"
    print(generate(target, steps=20, read_ms=5.0, repeats=3).read_text())
