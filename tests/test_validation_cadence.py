"""Validation spaced by its cost at the default cadence (validation_interval auto): the decision is a pure function
of measured durations, the loop feeds it, and the spacing it chose survives a resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import metric_rows, toy_config
from test_python_door import StopAt, small_task, weights

import trainer.evaluation as evaluation
from trainer import Trainer
from trainer.evaluation import THROTTLE_FROM_S, VALIDATION_SHARE, ValidationCadence, throttled_every
from trainer.finish import TrainingStopped

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("val_s", "epoch_s", "every", "expected"),
    [
        (0.1, 0.001, 1, 1),  # cheap validation runs every epoch, however short the epochs
        (THROTTLE_FROM_S, 100.0, 1, 1),  # costly but a tenth of an epoch: every epoch
        (1.0, 9.0, 1, 1),  # exactly a tenth of the wall time
        (1.0, 1.0, 1, 9),  # 1 s per 9 epochs of 1 s: a tenth
        (1.0, 0.5, 1, 18),
        (2.0, 1.0, 5, 18),
        (0.6, 1.0, 20, 20),  # never more often than the count cadence of a long run
    ],
)
def test_the_throttle_keeps_validation_near_a_tenth_of_the_wall_time(val_s, epoch_s, every, expected):
    k = throttled_every(val_s, epoch_s, every)
    assert k == expected
    if val_s >= THROTTLE_FROM_S and k > every:  # the largest share it allows, and one epoch fewer would exceed it
        assert val_s / (val_s + k * epoch_s) <= VALIDATION_SHARE + 1e-12
        assert val_s / (val_s + (k - 1) * epoch_s) > VALIDATION_SHARE


def test_the_cadence_changes_on_measurements_and_says_so():
    c = ValidationCadence(1, auto=True, patience=3)
    assert c.due(1) and c.measured(1, 9.0, 0.1) is None  # the first, with its warm-up: not measured
    assert c.due(2)
    line = c.measured(2, 2.0, 0.55)  # 2.0 s a validation, 0.55 s an epoch -> ceil(2*0.9/0.055) = 33
    assert c.every == 33 and line is not None
    assert line.startswith("validation: every 33 epochs and the last from epoch 33 (auto: one takes 2.00 s, an "
                           "epoch 0.55 s: 10% of the wall time, at most 10%; early stopping's patience of 3 "
                           "validations spans 99 epochs); --validation_interval N sets it")  # fmt: skip
    assert [e for e in range(3, 67) if c.due(e)] == [33, 66]
    assert c.measured(66, 2.0, 35.2) is None and c.every == 33  # means 2.0 s and 0.55 s: 33 again, no line
    assert c.state_dict() == {"every": 33}
    again = ValidationCadence(1, auto=True)
    again.load_state_dict(c.state_dict())
    assert again.every == 33
    given = ValidationCadence(2, auto=False)  # an explicit validation_interval is obeyed
    given.load_state_dict({"every": 33})
    assert given.due(2) and given.measured(2, 100.0, 0.01) is None and given.every == 2 and given.state_dict() == {}


def _val_epochs(run_dir) -> list[int]:
    return [r["epoch"] for r in metric_rows(run_dir) if r["kind"] == "val"]


def test_the_loop_feeds_the_cadence_and_a_resume_keeps_it(tmp_path, monkeypatch, capsys):
    """A costly validation (the decision forced to every 3 epochs from the second, measured one) validates at 1, 2,
    3, 6 and the last, 7, and says so; a run stopped in epoch 4 resumes with every 3 from its last.pt (epoch 6
    next, not 5) and trains the same weights as the run that was not stopped."""
    monkeypatch.setattr(evaluation, "throttled_every", lambda val_s, epoch_s, every: 3)
    whole = Trainer(toy_config(tmp_path, epochs=7, validation_interval=None, run_name="whole"), small_task()).fit()
    assert _val_epochs(tmp_path / "whole") == [1, 2, 3, 6, 7]
    assert any(n.startswith("validation: every 3 epochs and the last from epoch 3 (auto: ") for n in whole["notes"])
    assert "[plainloop] validation: every 3 epochs" in capsys.readouterr().out

    cfg = toy_config(tmp_path, epochs=7, validation_interval=None, run_name="cut")
    with pytest.raises(TrainingStopped):
        Trainer(cfg, small_task(), callbacks=[StopAt(10)]).fit()  # step 10: in epoch 4 (3 steps an epoch)
    ckpt = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["validation"] == {"every": 3}
    monkeypatch.setattr(evaluation, "throttled_every", lambda val_s, epoch_s, every: every)  # cheap from now on
    Trainer(toy_config(tmp_path, epochs=7, validation_interval=None, resume=str(tmp_path / "cut")), small_task()).fit()
    assert _val_epochs(tmp_path / "cut") == [1, 2, 3, 6, 7]  # 6 from the saved spacing; then every epoch again
    assert all(
        torch.equal(a, b) for a, b in zip(weights(tmp_path / "whole").values(), weights(tmp_path / "cut").values())
    )


def test_a_given_cadence_writes_no_cadence_state(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "throttled_every", lambda val_s, epoch_s, every: 3)
    Trainer(toy_config(tmp_path, epochs=3, validation_interval=1), small_task()).fit()
    assert _val_epochs(tmp_path / "run") == [1, 2, 3]
    assert "validation" not in torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert math.isfinite(json.loads((tmp_path / "run" / "summary.json").read_text())["train_time_s"])
