"""profile_steps(): trace and table in the directory given, valid JSON, and nothing on the console."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from utils.profiling import _native_output_to, profile_steps

ROOT = Path(__file__).resolve().parents[1]


def _step_fn() -> tuple[nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randn(16, 1)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return model, step


def test_profile_steps_writes_trace_and_table_silently(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _, step = _step_fn()
    out = tmp_path / "run" / "profile"  # the CLI passes RUN_DIR/profile; it is created
    r = profile_steps(step, out, steps=3, warmup=1)
    captured = capfd.readouterr()  # file-descriptor level: kineto writes below Python
    assert captured.out == "" and captured.err == "", captured
    assert Path(r["trace"]) == out / "trace.json" and Path(r["table"]) == out / "profile_top_ops.md"
    trace = json.loads(Path(r["trace"]).read_text())  # valid JSON
    steps = {e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) == 3  # only the recorded steps, not the warm-up one
    table = Path(r["table"]).read_text()
    assert "3 steps after 1 warm-up steps" in table and "| op |" in table and "aten::" in table
    assert r["kernels_per_step"] > 0 and r["syncs_per_step"] == 0 and r["device"] == "cpu"
    assert r["top_ops"] and all("ProfilerStep" not in o["name"] for o in r["top_ops"])
    assert not any("USDT" in m or "STAGE" in m for m in r["messages"])


@pytest.mark.slow
def test_profile_in_a_fresh_process_prints_nothing(tmp_path: Path) -> None:
    # The first profiler use in a process is the one that prints kineto's "Warm Up" stage as well.
    code = (
        "import sys, torch\n"
        "from utils.profiling import profile_steps\n"
        "m = torch.nn.Linear(8, 1)\n"
        "def step():\n"
        "    m(torch.randn(4, 8)).sum().backward()\n"
        "r = profile_steps(step, sys.argv[1], steps=2, warmup=2)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "p")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == "", (res.stdout, res.stderr)
    assert (tmp_path / "p" / "trace.json").is_file()


def test_native_output_filter_keeps_real_messages(capfd: pytest.CaptureFixture[str]) -> None:
    msgs: list[str] = []
    with _native_output_to(msgs):
        os.write(2, b"USDT:2026-11-22 03:05:35 5953:5953 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"STAGE:2026-11-22 03:05:42 6017:6017 SyncActivityProfilerHandler.cpp:51] Completed Stage\n")
        os.write(1, b"WARNING:2026-11-22 03:05:42 1:1 CuptiActivityProfiler.cpp:1] CUPTI insufficient privileges\n")
    print("console is back")
    captured = capfd.readouterr()
    assert captured.out == "console is back\n" and captured.err == ""
    assert msgs == ["WARNING:2026-11-22 03:05:42 1:1 CuptiActivityProfiler.cpp:1] CUPTI insufficient privileges"]


def test_step_errors_surface_and_the_profiler_stops(tmp_path: Path) -> None:
    calls = {"n": 0}

    def bad_step() -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom in step 2")
        torch.ones(4).sum()

    with pytest.raises(RuntimeError, match="boom in step 2"):
        profile_steps(bad_step, tmp_path / "a", steps=2, warmup=1)
    _, step = _step_fn()
    r = profile_steps(step, tmp_path / "b", steps=1, warmup=0)  # a second profile starts cleanly
    assert Path(r["trace"]).is_file()
    assert any("warmup" in m for m in r["messages"])  # torch's "won't be using warmup" warning, returned


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="steps=0"):
        profile_steps(lambda: None, tmp_path, steps=0)
    with pytest.raises(ValueError, match="warmup=-1"):
        profile_steps(lambda: None, tmp_path, warmup=-1)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        profile_steps(lambda: None, f)
