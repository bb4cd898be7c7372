"""Where the wall time went: summary.json's wall_time (steps, validation, checkpoints, the rest, adding up to the
wall time), the closing line that shows it, and the verdicts it gives (validation bound, checkpoint bound)."""

from __future__ import annotations

import pytest
from helpers import toy_config
from test_performance_monitor import _cpu_summary
from test_python_door import small_task

from trainer import Trainer
from trainer.finish import closing_lines, wall_shares, wall_split
from utils.bottleneck import diagnose

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_split_adds_up_to_the_wall_time():
    st = {"wall_s": 10.0, "steps_s": 6.0, "val_s": 1.5, "test_s": 0.5, "ckpt_s": 1.0, "iter_s": 6.5}
    split = wall_split(st)
    assert split == {"wall_s": 10.0, "steps_s": 6.0, "validation_s": 2.0, "checkpoints_s": 1.0, "rest_s": 1.0}
    assert wall_shares(split) == "wall 10.0 s: steps 60%, validation 20%, checkpoints 10%, rest 10%"
    # clocks read at different points that overlap a little: the parts never add past the wall, rest never < 0
    over = wall_split({"wall_s": 1.0, "steps_s": 0.9, "val_s": 0.2})
    assert over["rest_s"] == 0.0 and over["wall_s"] == pytest.approx(1.1)
    s = {"steps": 9, "train_time_s": 9.5, "samples_per_s": 320.4, "wall_time": split}
    assert closing_lines(s, None)[0] == (
        "[plainloop] done: 9 steps in 9.5 s (wall 10.0 s: steps 60%, validation 20%, checkpoints 10%, rest 10%), "
        "320 samples/s, 0 skipped, verdict: not judged"
    )


def test_a_run_writes_its_split_and_prints_it(tmp_path, capsys):
    summary = Trainer(toy_config(tmp_path, epochs=2), small_task()).fit()
    w = summary["wall_time"]
    parts = w["steps_s"] + w["validation_s"] + w["checkpoints_s"] + w["rest_s"]
    assert parts == pytest.approx(w["wall_s"]) and all(w[k] > 0 for k in ("steps_s", "validation_s", "checkpoints_s"))
    assert w["wall_s"] >= summary["train_time_s"]  # the fit's whole wall time: the test split and the summary too
    assert f"({wall_shares(w)}), " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("val", "ckpt", "verdict"),
    [
        (4.0, 0.5, "validation bound: 40% of the wall time"),
        (0.5, 2.5, "checkpoint bound: 25% of the wall time"),
        (1.0, 1.0, None),
    ],  # fmt: skip
)
def test_the_verdict_names_the_edges_that_took_the_time(val, ckpt, verdict):
    split = {"wall_s": 10.0, "steps_s": 10.0 - val - ckpt - 0.5, "validation_s": val, "checkpoints_s": ckpt,
             "rest_s": 0.5}  # fmt: skip
    v = diagnose(_cpu_summary(cpu_percent_mean=50.0), device_type="cpu", step_stats={"wall_time": split})
    if verdict is None:
        assert v["verdict"] not in ("validation bound", "checkpoint bound")
    else:
        assert v["headline"] == verdict
        assert any(e.startswith("wall time 10.0 s: steps ") for e in v["evidence"])
        assert ("validation_interval" if "validation" in verdict else "checkpoint_interval") in v["advice"]
