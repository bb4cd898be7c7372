"""The benchmark harnesses run end to end on tiny presets and write complete, finite, positive figures.

No timed assertions: speed is what the harness reports, not what a unit test checks.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from benchmarks.common import all_figures_finite, stats

pytest.importorskip("netCDF4")

PER_REP_POSITIVE = (
    "wall_s",
    "samples",
    "steps",
    "samples_per_s",
    "step_time_s",
    "compute_frac",
    "peak_memory_mb",
)
SUMMARY_POSITIVE = (
    "step_time_s",
    "compute_frac",
    "peak_memory_mb",
    "mfu",
    "job_s",
    "vs_before",
    "batch_size",
)


def _positive_finite(v: object, where: str) -> None:
    assert isinstance(v, int | float) and not isinstance(v, bool), f"{where}: {v!r} is not a number"
    assert math.isfinite(v) and v > 0, f"{where}: {v!r} is not positive and finite"


def test_run_harness_tiny_cpu(tmp_path):
    from benchmarks import run

    out = tmp_path / "run.json"
    configs = "before,defaults" + (",lightning" if _has_lightning() else "")
    run.main(
        [
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--reps",
            "2",
            "--configs",
            configs,
            "--out",
            str(out),
        ]
    )
    res = json.loads(out.read_text())
    assert out.with_suffix(".md").read_text().count("| before (seed loop) |") == 1

    for key in (
        "schema",
        "preset",
        "environment",
        "config",
        "peak",
        "repetitions",
        "summary",
        "targets",
        "flops_per_sample",
        "job_samples",
        "guide_estimate",
    ):
        assert key in res, f"missing {key}"
    env = res["environment"]
    for key in ("device", "torch", "commit", "cpu", "time_utc"):
        assert env[key], f"environment.{key} empty"
    assert env["torch"] == torch.__version__
    _positive_finite(res["peak"]["flops"], "peak.flops")
    _positive_finite(res["flops_per_sample"], "flops_per_sample")
    assert all_figures_finite(res) == []

    expected = configs.split(",")
    assert sorted(res["repetitions"]) == sorted(expected)
    for name in expected:
        reps = res["repetitions"][name]
        assert len(reps) == 2 and [r["rep"] for r in reps] == [0, 1]
        for r in reps:
            for k in PER_REP_POSITIVE:
                _positive_finite(r[k], f"{name}.{k}")
            assert 0 <= r["data_wait_frac"] < 1 and 0 <= r["outside_steps_frac"] < 1
            assert r["data_wait_frac"] + r["compute_frac"] == pytest.approx(1.0)
        s = res["summary"][name]
        sp = s["samples_per_s"]
        for k in ("median", "min", "max"):
            _positive_finite(sp[k], f"{name}.samples_per_s.{k}")
        assert sp["min"] <= sp["median"] <= sp["max"]
        for k in SUMMARY_POSITIVE:
            _positive_finite(s[k], f"summary.{name}.{k}")
        # the derived figures are the documented arithmetic of the raw ones
        assert s["job_s"] == pytest.approx(res["job_samples"] / sp["median"])
        assert s["mfu"] == pytest.approx(res["flops_per_sample"] * sp["median"] / res["peak"]["flops"])
    assert res["summary"]["before"]["vs_before"] == pytest.approx(1.0)
    assert res["summary"]["before"]["batch_size"] == 20 and res["summary"]["defaults"]["batch_size"] == 60
    assert [t["target"] for t in res["targets"]] == ["defaults vs before", "defaults vs lightning"]
    for t in res["targets"]:
        assert t["met"] == (t["value"] is not None and t["value"] >= t["goal"])
        assert t["met"] or t["explanation"] or t["value"] is None


def _has_lightning() -> bool:
    from benchmarks.lightning_peer import lightning_available

    return lightning_available() is not None


def test_before_dataset_matches_cached_path(tmp_path):
    """The 'before' loop reads netCDF per sample but must produce the cached path's numbers."""
    from benchmarks.before_loop import NetCDFPerSampleDataset
    from datasets.era5 import ERA5SSTMonthlyDataset
    from datasets.era5_sample import ensure_sample_file

    path = ensure_sample_file(tmp_path, years=3, grid=5.0)
    ref = ERA5SSTMonthlyDataset(
        resolution=10.0, data_path=str(path), split="val", cache_dir=tmp_path, device_cache=False
    )
    slow = NetCDFPerSampleDataset(ref, path)
    assert len(slow) == len(ref) > 0
    for i in (0, len(ref) - 1):
        (xs, ys), (xc, yc) = slow[i], ref[i]
        np.testing.assert_allclose(xs.numpy(), xc.numpy(), atol=1e-5)
        np.testing.assert_allclose(ys.numpy(), yc.numpy(), atol=1e-5)


def test_loop_overhead_harness(tmp_path):
    from benchmarks import loop_overhead

    out = tmp_path / "lo.json"
    loops = "hand,plainloop" + (",lightning" if _has_lightning() else "")
    res = loop_overhead.main(
        ["--steps", "100", "--warmup", "50", "--reps", "2", "--loops", loops, "--out", str(out)]
    )
    saved = json.loads(out.read_text())
    assert saved["schema"] == res["schema"] == "plainloop-bench-loop-overhead-1"
    assert all_figures_finite(saved) == []
    for name in loops.split(","):
        assert len(saved["repetitions"][name]) == 2
        for v in saved["repetitions"][name]:
            _positive_finite(v, f"{name} samples/s")
        _positive_finite(saved["vs_hand"][name], f"vs_hand.{name}")
    assert saved["vs_hand"]["hand"] == pytest.approx(1.0)
    worst = min(saved["vs_hand"]["plainloop"], saved["vs_hand_paired"]["plainloop"])
    assert saved["target_met"] == (worst >= saved["target_vs_hand"])


def test_stats_and_bad_input():
    s = stats([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no values"):
        stats([])
    from benchmarks import run

    with pytest.raises(SystemExit):
        run.main(["--configs", "before,nonsense"])
