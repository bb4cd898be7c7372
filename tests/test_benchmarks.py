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
    configs = "before,defaults,seed_loader,user_trainer,user_base"
    configs += ",lightning,lightning_data" if _has_lightning() else ""
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
    # the rows differ in what they say they differ in
    reps = res["repetitions"]
    assert all(r["data_path"] == "held on the device" for r in reps["defaults"] + reps["user_trainer"])
    assert all(
        r["data_path"].startswith("DataLoader") and "'num_workers': 2" in r["data_path"] for r in reps["seed_loader"]
    )
    for name in ("user_trainer", "user_base"):
        assert res["summary"][name]["batch_size"] == 60 and res["summary"][name]["precision"] == "32"
    split = res["split"]
    assert split["data_path"]["rows"] == ["defaults", "seed_loader"]
    _positive_finite(split["data_path"]["ratio"], "split.data_path")
    if _has_lightning():
        assert reps["lightning_data"][0]["loader"] == {"gather": "dataset.gather, 0 workers"}
        assert reps["lightning_data"][0]["precision"] == "32-true"
        assert split["total"]["ratio"] == pytest.approx(
            split["loop"]["ratio"] * split["lightning_data_path_and_precision"]["ratio"]
        )
    h = res["headline"]
    assert h["config"] == "defaults" and h["vs_before"] == pytest.approx(res["summary"]["defaults"]["vs_before"])
    assert h["gpu_util_mean"] is None and h["gpu_util_mean_note"]
    md = out.with_suffix(".md").read_text()
    assert "| user model, BaseTrainer |" in md and "the data path alone, in plainloop" in md
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


def test_loop_overhead_harness(tmp_path, capfd):
    from benchmarks import loop_overhead

    out = tmp_path / "lo.json"
    loops = "hand,plainloop,basetrainer" + (",lightning" if _has_lightning() else "")
    res = loop_overhead.main(["--steps", "200", "--warmup", "100", "--reps", "2", "--loops", loops, "--out", str(out)])
    # the output is the benchmark's own: no Lightning progress bar or notes, no plainloop epoch/start-up lines
    printed = capfd.readouterr()
    lines = [ln for ln in printed.out.splitlines() if ln.startswith("[")]
    assert lines and all(ln.startswith("[overhead]") for ln in lines), printed.out[:2000]
    assert "it/s" not in printed.out + printed.err and "GPU available" not in printed.err, printed.err[:2000]
    saved = json.loads(out.read_text())
    assert saved["schema"] == res["schema"] == "plainloop-bench-loop-overhead-1"
    assert all_figures_finite(saved) == []
    for name in loops.split(","):
        assert len(saved["repetitions"][name]) == 2
        for v in saved["repetitions"][name]:
            _positive_finite(v, f"{name} samples/s")
        _positive_finite(saved["vs_hand"][name], f"vs_hand.{name}")
    assert saved["vs_hand"]["hand"] == pytest.approx(1.0)
    # met only when every engine loop reaches the target on both ratios (which loops pass depends on the machine)
    assert set(saved["target_met_by"]) == {"plainloop", "basetrainer"}
    for name, ok in saved["target_met_by"].items():
        assert ok == (min(saved["vs_hand"][name], saved["vs_hand_paired"][name]) >= saved["target_vs_hand"])
    assert saved["target_met"] == all(saved["target_met_by"].values())


def test_stats_and_bad_input():
    s = stats([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no values"):
        stats([])
    from benchmarks import run

    with pytest.raises(SystemExit):
        run.main(["--configs", "before,nonsense"])


def _rep(name: str, rep: int, sps: float) -> dict:
    return {"config": name, "rep": rep, "samples_per_s": sps}


def test_speedup_split_is_a_product_of_paired_ratios():
    """total = loop x (Lightning's data path and precision), and that = data path x precision, exactly."""
    from benchmarks.run import speedup_split

    rates = {
        "defaults": [300, 240, 310],
        "lightning": [100, 90, 120],
        "lightning_data": [250, 200, 260],
        "lightning_fp32": [110, 80, 100],
        "seed_loader": [150, 100, 160],
    }
    reps = {k: [_rep(k, i, v) for i, v in enumerate(vs)] for k, vs in rates.items()}
    s = speedup_split(reps)
    assert s["total"]["ratio"] == pytest.approx(s["loop"]["ratio"] * s["lightning_data_path_and_precision"]["ratio"])
    assert s["lightning_data_path_and_precision"]["ratio"] == pytest.approx(
        s["lightning_data_path"]["ratio"] * s["lightning_precision"]["ratio"]
    )
    assert s["loop"]["ratio"] == pytest.approx(300 / 250)
    assert s["data_path"]["paired"] == pytest.approx(stats([300 / 150, 240 / 100, 310 / 160])["median"])
    assert "loop" not in speedup_split({k: v for k, v in reps.items() if k != "lightning_data"})


def test_run_gpu_sh_tiny_mode_writes_every_quoted_figure(tmp_path):
    """`TINY=1 bash benchmarks/run_gpu.sh` runs the GPU script's steps on the CPU and writes the headline."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    configs = "before,defaults,tuned" + (",lightning_data" if _has_lightning() else "")
    env = dict(
        os.environ,
        TINY="1",
        PYTHON=sys.executable,
        OUT_DIR=str(tmp_path / "out"),
        CACHE_DIR=str(tmp_path / "cache"),
        CONFIGS=configs,
        CUDA_VISIBLE_DEVICES="",
        OUT=str(tmp_path),  # a directory some shells and job runners export: the result path is OUT_JSON
    )
    p = subprocess.run(
        ["bash", str(root / "benchmarks" / "run_gpu.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "failed" not in p.stdout, p.stdout[-3000:]
    res = json.loads((tmp_path / "out" / "run_tiny.json").read_text())
    h = res["headline"]
    assert h["config"] == "tuned"
    for k in ("vs_before", "mfu", "data_wait_frac", "job_s", "samples_per_s"):
        _positive_finite(h[k] if k != "data_wait_frac" else h[k] + 1.0, f"headline.{k}")
    assert h["vs_lightning_data"] is not None or not _has_lightning()
    assert "x before" in p.stdout and "x Lightning seed" in p.stdout and "MFU" in p.stdout
    # host cost: the seed loop reads the loss every step; plainloop's GPU path reads nothing inside an epoch
    hc = json.loads((tmp_path / "out" / "host_cost_tiny.json").read_text())["summary"]["tiny"]
    assert hc["before"]["syncs_per_step"]["median"] == 1
    assert hc["plainloop_gpu_path"]["syncs_per_step"]["median"] == 0
    assert hc["plainloop"]["syncs_per_step"]["median"] == 1  # on a CPU the guard's flag is read: free there
    for loop in hc.values():
        _positive_finite(loop["outside_ops_us_median"]["median"], "outside_ops_us")
    assert json.loads((tmp_path / "out" / "loop_overhead_tiny.json").read_text())["vs_hand"]["plainloop"] > 0


def test_run_gpu_sh_installs_nothing():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "benchmarks" / "run_gpu.sh").read_text()
    code = [line.split("#")[0] for line in text.splitlines() if not line.lstrip().startswith("#")]
    for word in ("pip install", "pip3 install", "apt-get", "conda install", "uv pip", "curl ", "wget "):
        hits = [line for line in code if word in line and "sys.exit" not in line]
        assert not hits, f"run_gpu.sh must install nothing: {hits}"


def test_scaling_quick(tmp_path):
    """Tiny files, both layouts, two lengths: every measurement present; the xarray peer (when installed)
    computes the same area mean as plainloop's cache."""
    import importlib.util

    from benchmarks import scaling

    res = scaling.main(["--quick", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "s.json")])
    rows = res["era5"]["rows"]
    assert [(r["layout"], r["years"]) for r in rows] == [
        ("legacy", 1),
        ("legacy", 2),
        ("cds2024", 1),
        ("cds2024", 2),
    ]
    for r in rows:
        b = r["build"]
        assert "error" not in b, b
        assert b["months"] == 12 * r["years"] and b["grid"] == [16, 36]
        assert b["cache_bytes"] > 16 * 36 * 4 * b["months"]  # the float32 array and its sidecar
        for peer in res["config"]["peers"]:
            assert r[peer]["max_abs_diff_c"] is not None and r[peer]["max_abs_diff_c"] < 1e-3, r[peer]
    assert rows[1]["build"]["cache_bytes"] > rows[0]["build"]["cache_bytes"]
    assert res["growth"]["legacy"]["build.seconds"]["years_ratio"] == 2
    train = res["era5"]["train"]
    assert [t["years"] for t in train] == [1, 2]
    for t in train:
        _positive_finite(t["first_epoch_s"], "first_epoch_s")
        _positive_finite(t["steady_epoch_s"], "steady_epoch_s")
        assert len(t["epochs_s"]) == 2
    assert res["sampler"][0]["batches"] > 0 and res["sampler"][0]["construction_median_s"] > 0
    have = importlib.util.find_spec("xarray") is not None
    assert bool(res["config"]["peers"]) == have
    assert (tmp_path / "s.md").read_text().count("| legacy |") == 2


def test_lightning_model_benchmark_quick(tmp_path):
    """benchmarks/lightning_model.py: a LightningModule under lightning.Trainer and plainloop, side by side."""
    pytest.importorskip("lightning")
    from benchmarks.lightning_model import main

    out = tmp_path / "lm.json"
    result = main(["--quick", "--out", str(out)])
    assert out.is_file() and out.with_suffix(".md").is_file()
    assert {r["trainer"] for r in result["runs"]} == {"lightning", "plainloop"}
    # the same model, data and schedule: the two trainers end close (not bit-equal: different shuffles)
    v = result["val_loss"]
    assert abs(v["plainloop"]["median"] - v["lightning"]["median"]) < 0.2 * v["lightning"]["median"]


def test_user_loop_benchmark_quick(tmp_path):
    """benchmarks/user_loop.py: plainloop vs a hand loop on an in-memory dataset; auto picks 0 workers for it."""
    from benchmarks.user_loop import main

    result = main(["--quick", "--out", str(tmp_path / "ul.json")])
    assert result["auto_num_workers"] == 0
    assert result["index_cost_s_per_sample"] < result["cheap_threshold_s_per_sample"]
    assert set(result["crossover_s"]) == {"0.0", "30.0"}


def test_checkpoint_cost_times_each_save_and_its_no_save_variant_skips_the_per_epoch_one(tmp_path):
    from benchmarks import checkpoint_cost

    r = checkpoint_cost.main(
        ["--preset", "tiny", "--reps", "1", "--variants", "as_is,no_save", "--cache-dir", str(tmp_path / "c"),
         "--out", str(tmp_path / "ck.json")]
    )  # fmt: skip
    as_is, no_save = r["runs"]["as_is"][0], r["runs"]["no_save"][0]
    assert len(as_is["phases_ms"]["save"]) == len(as_is["phases_ms"]["digest"]) >= 2  # every save hashed once
    assert len(no_save["phases_ms"]["digest"]) == len(as_is["phases_ms"]["digest"]) - 1  # epoch 1's last.pt
    assert r["checkpoint_mb"] > 0 and (tmp_path / "ck.md").read_text().count("| as_is |") == 1
    for run in (as_is, no_save):
        _positive_finite(run["samples_per_s"], "samples_per_s")
