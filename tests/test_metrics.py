import numpy as np
import pytest
import torch

from utils.metrics import acc, format_scores, lat_weights, score_forecasts, weighted_rmse

LATS = np.array([-60.0, -20.0, 0.0, 20.0, 60.0])


def _fields(n=4, seed=0):
    rng = np.random.default_rng(seed)
    clim = 15 + rng.standard_normal((n, 5, 6))
    truth = clim + rng.standard_normal((n, 5, 6))
    mask = np.ones((5, 6), bool)
    mask[0, :2] = False
    return truth, clim, mask


def test_lat_weights_cosine_mean_one():
    w = lat_weights(LATS)
    assert w.mean() == pytest.approx(1.0)
    assert w[0] / w[2] == pytest.approx(np.cos(np.deg2rad(60.0)))


def test_rmse_zero_for_perfect_and_equals_constant_error():
    truth, _, mask = _fields()
    assert weighted_rmse(truth, truth, LATS, mask) == 0.0
    assert weighted_rmse(truth + 0.7, truth, LATS, mask) == pytest.approx(0.7)


def test_rmse_weights_rows_by_cosine_and_ignores_land():
    truth, _, mask = _fields()
    pred = truth.copy()
    err = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    pred += err[None, :, None]
    pred[:, ~mask] = np.nan  # land NaN must not leak
    w = np.cos(np.deg2rad(LATS))[:, None] * np.ones((5, 6))
    expect = np.sqrt(np.sum((w * err[:, None] ** 2)[mask]) / np.sum(w[mask]))
    assert weighted_rmse(pred, truth, LATS, mask) == pytest.approx(expect)
    assert weighted_rmse(torch.tensor(pred), torch.tensor(truth), LATS, torch.tensor(mask)) == pytest.approx(expect)


def test_acc_perfect_reversed_and_climatology():
    truth, clim, mask = _fields()
    assert acc(truth, truth, clim, LATS, mask) == pytest.approx(1.0)
    assert acc(2 * clim - truth, truth, clim, LATS, mask) == pytest.approx(-1.0)
    assert acc(clim, truth, clim, LATS, mask) == 0.0


def test_score_forecasts_baselines_follow_their_definitions():
    truth, clim_t, mask = _fields(seed=1)
    _, clim_i, _ = _fields(seed=2)
    last = truth + 0.5
    scores = score_forecasts(truth, truth, last, clim_t, clim_i, LATS, mask)
    assert set(scores) == {"model", "persistence", "climatology", "anomaly_persistence"}
    assert scores["model"]["rmse"] == 0.0
    assert scores["persistence"]["rmse"] == pytest.approx(0.5)
    assert scores["climatology"]["rmse"] == pytest.approx(weighted_rmse(clim_t, truth, LATS, mask))
    ap = clim_t + (last - clim_i)
    assert scores["anomaly_persistence"]["rmse"] == pytest.approx(weighted_rmse(ap, truth, LATS, mask))
    table = format_scores(scores)
    assert "anomaly_persistence" in table and "RMSE" in table and f"{scores['persistence']['rmse']:.4f}" in table


def test_shape_mismatch_and_empty_mask_are_errors():
    truth, clim, mask = _fields()
    with pytest.raises(ValueError, match="shape"):
        weighted_rmse(truth[:, :3], truth, LATS, mask)
    with pytest.raises(ValueError, match="no ocean"):
        weighted_rmse(truth, truth, LATS, np.zeros_like(mask))


def test_score_forecasts_scores_extra_baselines_by_name():
    truth, clim_t, mask = _fields(seed=3)
    extra = {"damped_persistence": clim_t + 0.3, "lim": truth}
    scores = score_forecasts(truth + 0.1, truth, truth, clim_t, clim_t, LATS, mask, extra=extra)
    assert list(scores)[-2:] == ["damped_persistence", "lim"]
    assert scores["damped_persistence"]["rmse"] == pytest.approx(weighted_rmse(clim_t + 0.3, truth, LATS, mask))
    assert scores["lim"]["rmse"] == 0.0 and scores["lim"]["acc"] == pytest.approx(1.0)
    assert "| lim |" in format_scores(scores)
    with pytest.raises(ValueError, match="clashes"):
        score_forecasts(truth, truth, truth, clim_t, clim_t, LATS, mask, extra={"persistence": truth})


def test_score_forecasts_reuses_the_baselines_of_an_earlier_call_on_the_split():
    """A validation after the first scores only the model: the baselines' numbers are the first call's, and the
    result is the same as scoring everything again."""
    truth, clim_t, mask = _fields(seed=4)
    extra = {"damped_persistence": clim_t + 0.3}
    args = (truth, truth + 0.2, clim_t, clim_t - 0.1, LATS, mask)
    first = score_forecasts(truth + 0.4, *args, extra=extra)
    kept = {k: v for k, v in first.items() if k != "model"}
    again = score_forecasts(truth - 0.3, *args, extra=extra)
    reused = score_forecasts(truth - 0.3, *args, baselines=kept)
    assert reused == again and list(reused) == list(again)
    sentinel = {"persistence": {"rmse": -1.0, "acc": -1.0}}  # taken as given, not recomputed
    assert score_forecasts(truth, *args, baselines=sentinel)["persistence"] == {"rmse": -1.0, "acc": -1.0}
