"""Statistical baselines on synthetic fields where the answer is known."""

import numpy as np
import pytest

from utils.baselines import (
    DampedPersistence,
    LinearInverseModel,
    Z,
    baseline_forecasts,
    choice_reason,
    choose_on_validation,
    fit_baselines,
    gain_and_se,
)

LATS = np.array([-20.0, -10.0, 0.0, 10.0, 20.0, 30.0])


def ar1_field(phi: np.ndarray, T: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.zeros((T,) + phi.shape)
    for t in range(1, T):
        a[t] = phi * a[t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal(phi.shape)
    return a


def test_damped_persistence_recovers_ar1_coefficient():
    phi = np.linspace(0.2, 0.9, 12).reshape(3, 4)
    a = ar1_field(phi, 6000)
    mask = np.ones(phi.shape, bool)
    mask[0, 0] = False
    a[:, 0, 0] = np.nan  # land
    for lead in (1, 3):
        dp = DampedPersistence.fit(a, lead, mask)
        np.testing.assert_allclose(dp.r[mask], (phi**lead)[mask], atol=0.04)
        assert np.isnan(dp.r[0, 0])
    f = DampedPersistence.fit(a, 1, mask).predict(np.ones((2,) + phi.shape))
    assert f.shape == (2, 3, 4) and np.isnan(f[:, 0, 0]).all()


def _patterns(m: int, shape: tuple[int, int], seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """m orthonormal patterns in the sqrt(cos φ)-weighted space, and the weights."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((shape[0] * shape[1], m)))
    sw = np.broadcast_to(np.sqrt(np.cos(np.deg2rad(LATS)))[:, None], shape).reshape(-1)
    return q.T, sw  # (m, cells), (cells,)


def test_lim_recovers_a_known_propagator():
    shape = (6, 5)
    P, sw = _patterns(3, shape)
    c, s = np.cos(0.4), np.sin(0.4)
    A = np.array([[0.85 * c, -0.85 * s, 0.0], [0.85 * s, 0.85 * c, 0.0], [0.0, 0.0, 0.6]])  # rotation + damping
    rng = np.random.default_rng(2)
    T = 8000
    x = np.zeros((T, 3))
    for t in range(1, T):
        x[t] = A @ x[t - 1] + rng.standard_normal(3)
    field = ((x @ P) / sw).reshape(T, *shape)  # grid anomalies whose weighted EOFs span P exactly
    lim = LinearInverseModel.fit(field, LATS, variance=0.999, max_modes=10)
    assert lim.modes == 3 and lim.explained > 0.999
    # the propagator is basis-free in grid space: E^T G E == P^T A P
    got = lim.eofs.T @ lim.g1 @ lim.eofs
    np.testing.assert_allclose(got, P.T @ A @ P, atol=0.03)
    # a 2-month forecast applies A twice
    state = x[-1]
    pred = lim.predict(((state @ P) / sw).reshape(shape), lead=2)
    np.testing.assert_allclose((pred.reshape(-1) * sw) @ P.T, A @ A @ state, atol=0.1 * np.abs(state).max())


def test_lim_truncates_to_variance_and_caps_modes():
    a = ar1_field(np.full((6, 5), 0.7), 400, seed=3)  # white in space: no dominant pattern
    lim = LinearInverseModel.fit(a, LATS, variance=0.5, max_modes=30)
    assert 1 <= lim.modes <= 30 and lim.explained >= 0.5
    assert LinearInverseModel.fit(a, LATS, variance=1.0, max_modes=4).modes == 4
    assert LinearInverseModel.fit(a[:60], LATS, variance=1.0, max_modes=30).modes == 6  # at most T / 10


def test_baseline_forecasts_follow_their_definitions():
    phi = np.full((6, 5), 0.8)
    a = ar1_field(phi, 500)
    mask = np.ones(phi.shape, bool)
    fitted = fit_baselines(a, LATS, mask, lead=3)
    rng = np.random.default_rng(4)
    last, ct, ci = 15 + rng.standard_normal((3, 2, 6, 5))
    f = baseline_forecasts(fitted, 3, last, ct, ci)
    np.testing.assert_allclose(f["persistence"], last)
    np.testing.assert_allclose(f["climatology"], ct)
    np.testing.assert_allclose(f["anomaly_persistence"], ct + last - ci)
    np.testing.assert_allclose(f["damped_persistence"], ct + fitted["damped_persistence"].r * (last - ci))
    np.testing.assert_allclose(f["lim"], ct + fitted["lim"].predict(last - ci, 3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: DampedPersistence.fit(a, 0), "lead=0"),
        (lambda a: DampedPersistence.fit(a[0], 1), r"\(T, H, W\)"),
        (lambda a: DampedPersistence.fit(a, 1, np.ones((2, 2), bool)), "mask shape"),
        (lambda a: LinearInverseModel.fit(a, LATS[:3]), "latitudes"),
        (lambda a: LinearInverseModel.fit(a, LATS, variance=0), "variance"),
        (lambda a: LinearInverseModel.fit(a, LATS).predict(a[:1], lead=0), "lead=0"),
    ],
)
def test_bad_inputs_are_clear_errors(call, match):
    a = ar1_field(np.full((6, 5), 0.5), 100)
    with pytest.raises(ValueError, match=match):
        call(a)


def test_nan_on_an_ocean_cell_is_an_error():
    a = ar1_field(np.full((6, 5), 0.5), 100)
    a[10, 2, 2] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        DampedPersistence.fit(a, 1, np.ones((6, 5), bool))


@pytest.mark.slow
def test_hybrid_recovers_the_ar1_coefficient_of_the_eof_residual():
    from utils.baselines import HybridLIM

    shape, T, phi = (6, 5), 6000, 0.7
    P, sw = _patterns(3, shape)
    rng = np.random.default_rng(3)
    x = np.zeros((T, 3))
    r = np.zeros((T, shape[0] * shape[1]))
    for t in range(1, T):
        x[t] = 0.8 * x[t - 1] + 3.0 * rng.standard_normal(3)  # large-scale modes the LIM keeps
        r[t] = phi * r[t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal(r.shape[1])  # grid-scale AR(1)
    r -= (r @ P.T) @ P  # the residual lies outside the modes' span (weighted space: r is weighted already)
    field = ((x @ P + r) / sw).reshape(T, *shape)
    for lead in (1, 3):
        hyb = HybridLIM.fit(field, LATS, lead, max_modes=3)
        assert hyb.lim.modes == 3
        np.testing.assert_allclose(hyb.residual.r, phi**lead, atol=0.05)
    # at lead 1 the hybrid beats the LIM alone by the residual's predictable part
    hyb = HybridLIM.fit(field[:5000], LATS, 1, max_modes=3)
    last, truth = field[5000:-1], field[5001:]
    err_h = np.mean((hyb.predict(last) - truth) ** 2)
    err_l = np.mean((hyb.lim.predict(last, 1) - truth) ** 2)
    assert err_h < err_l
    fitted = fit_baselines(field[:5000], LATS, np.ones(shape, bool), 1, max_modes=3)
    ct = np.zeros((2,) + shape)
    f = baseline_forecasts(fitted, 1, last[:2], ct, ct)
    np.testing.assert_allclose(f["hybrid"], hyb.predict(last[:2]))


def test_ridge_correction_finds_a_seasonally_modulated_error():
    from utils.baselines import LinearInverseModel, RidgeCorrection

    shape, T = (6, 5), 1200
    P, sw = _patterns(2, shape)
    rng = np.random.default_rng(4)
    pcs = rng.standard_normal((T, 2))
    field = ((pcs @ P) / sw).reshape(T, *shape)
    cal = np.arange(T) % 12
    gain = np.cos(2 * np.pi * cal / 12)  # the error the base forecast misses flips sign with the season
    err = np.zeros_like(field)
    err[1:] = gain[1:, None, None] * 0.5 * field[:-1]
    basis = LinearInverseModel.fit(field, LATS, variance=0.999, max_modes=2)
    inputs, target = field[:-1, None], err[1:]
    tr, te = slice(0, 1000), slice(1000, None)

    def mse(seasonal: bool) -> float:
        rc = RidgeCorrection.fit(basis, inputs[tr], cal[1:][tr], target[tr], modes=2, seasonal=seasonal, alpha=1e-4)
        return float(np.mean((rc.predict(inputs[te], cal[1:][te]) - target[te]) ** 2))

    assert mse(True) < 0.05 * np.mean(target[te] ** 2) < mse(False)


def test_ridge_correction_recovers_a_remote_driver_through_wide_predictors():
    from utils.baselines import LinearInverseModel, RidgeCorrection

    rng = np.random.default_rng(5)
    T, shape, wshape = 1200, (6, 5), (6, 8)
    remote = rng.standard_normal(T)  # a mode that lives outside the area (e.g. ENSO for the Indian Ocean)
    pr, swr = _patterns(1, wshape, seed=3)
    wide = ((remote[:, None] * pr) / swr).reshape(T, *wshape) + 0.05 * rng.standard_normal((T, *wshape))
    area = rng.standard_normal((T, *shape))  # the area's own anomalies carry nothing about the remote mode
    P, _ = _patterns(1, shape, seed=4)
    err = np.zeros((T, *shape))
    err[1:] = 0.8 * remote[:-1, None, None] * P.reshape(shape)  # next month's miss follows the remote mode
    basis = LinearInverseModel.fit(area, LATS, variance=0.999, max_modes=3)
    wbasis = LinearInverseModel.fit(wide, LATS, variance=0.999, max_modes=3)
    inputs, winputs, cal, target = area[:-1, None], wide[:-1, None], np.arange(T - 1) % 12, err[1:]
    tr, te = slice(0, 1000), slice(1000, None)

    def mse(wmodes: int) -> float:
        kw = dict(wide=wbasis, wide_inputs=winputs[tr], wide_modes=wmodes) if wmodes else {}
        rc = RidgeCorrection.fit(basis, inputs[tr], cal[tr], target[tr], modes=3, alpha=1e-4, **kw)
        pred = rc.predict(inputs[te], cal[te], winputs[te] if wmodes else None)
        return float(np.mean((pred - target[te]) ** 2))

    var = float(np.mean(target[te] ** 2))
    assert mse(3) < 0.05 * var and mse(0) > 0.9 * var  # only the wide predictors see the driver
    rc = RidgeCorrection.fit(basis, inputs[tr], cal[tr], target[tr], wide=wbasis, wide_inputs=winputs[tr], wide_modes=2)
    with pytest.raises(ValueError, match="wide_modes=2 needs the wide basis and wide_inputs"):
        rc.predict(inputs[te], cal[te])
    with pytest.raises(ValueError, match="do not match"):
        rc.predict(inputs[te], cal[te], winputs[tr])


DEFAULT = 1.0 + 0.1 * np.random.default_rng(0).standard_normal(36)  # per-month squared errors of a default


def _candidate(gain, noise, seed=1):
    """Per-month squared errors of a candidate whose mean gain over DEFAULT is exactly `gain`, scattered by
    `noise` month to month."""
    e = np.random.default_rng(seed).standard_normal(len(DEFAULT))
    return DEFAULT - gain + noise * (e - e.mean())


def test_the_default_stays_where_another_candidate_is_only_noisily_better():
    default, other = DEFAULT, _candidate(gain=0.01, noise=0.3)
    gain, se = gain_and_se(other, default)
    assert gain == pytest.approx(0.01) and 0 < gain < Z * se  # lower on these months, by less than the noise
    assert choose_on_validation({"blend": default, "wide_hybrid": other}) == ("blend", 0.0, 0.0)
    assert choice_reason(0.0, 0.0, "blend") == "default"


def test_a_clearly_better_candidate_is_switched_to_and_the_largest_clear_gain_wins():
    default, small, large = DEFAULT, _candidate(gain=0.1, noise=0.05), _candidate(gain=0.2, noise=0.05, seed=2)
    noisy_larger = _candidate(gain=0.3, noise=3.0, seed=3)  # the largest mean gain, but noise
    name, gain, se = choose_on_validation({"blend": default, "hybrid": small, "wide": large, "lim": noisy_larger})
    assert name == "wide" and gain == pytest.approx(0.2) and 0 < se < gain / Z
    assert choice_reason(gain, se, "blend").startswith("validation gain 0.2 ± ")


def test_overlapping_errors_at_longer_leads_need_a_larger_gain():
    default, other = DEFAULT, _candidate(gain=0.12, noise=0.3)  # se ~0.05 at lead 1, x sqrt(6) at lead 6
    assert choose_on_validation({"hybrid": default, "blend": other}, lead=1)[0] == "blend"
    assert choose_on_validation({"hybrid": default, "blend": other}, lead=6)[0] == "hybrid"
    with pytest.raises(ValueError, match="no candidate"):
        choose_on_validation({})


def test_neighbour_term_finds_a_drifting_residual_and_stays_out_of_an_independent_one():
    from utils.baselines import DampedPersistence, NeighbourResidual

    shape, T, phi = (6, 8), 3000, 0.8
    mask = np.ones(shape, bool)
    mask[0, 0] = False  # a land cell: never a predictor, never predicted
    rng = np.random.default_rng(5)
    drift = np.zeros((T, *shape))
    for t in range(1, T):  # each anomaly moves one cell east a month and decays
        drift[t, :, 1:] = phi * drift[t - 1, :, :-1]
        drift[t] += rng.standard_normal(shape)
    drift[:, ~mask] = np.nan
    dp = DampedPersistence.fit(drift, 1, mask)
    nb = NeighbourResidual.fit(drift, dp, mask)
    assert nb is not None
    west = nb.coef[2:, 2:, 3]  # index 3: the cell to the west (row 0, column -1)
    np.testing.assert_allclose(west, phi, atol=0.08)
    assert np.abs(np.delete(nb.coef[2:, 2:], [3, 4], axis=-1)).max() < 0.1
    assert (nb.coef[~mask] == 0).all()
    pred = nb.predict(drift[2900:-1], mask) + dp.predict(drift[2900:-1])
    err_nb = np.nanmean((pred - drift[2901:]) ** 2)
    err_dp = np.nanmean((dp.predict(drift[2900:-1]) - drift[2901:]) ** 2)
    assert err_nb < 0.75 * err_dp
    # independent AR(1) cells: damping already says all there is; the term is absent or negligible
    ar = np.zeros((T, *shape))
    for t in range(1, T):
        ar[t] = phi * ar[t - 1] + rng.standard_normal(shape)
    dp = DampedPersistence.fit(ar, 1, mask)
    nb = NeighbourResidual.fit(ar, dp, mask)
    assert nb is None or np.abs(nb.coef).max() < 0.05


def test_hybrid_neighbour_term_is_optional_and_adds_to_the_damped_residual():
    from utils.baselines import HybridLIM

    rng = np.random.default_rng(2)
    field = np.zeros((400, 6, 5))
    for t in range(1, 400):  # a residual that drifts east, as above
        field[t, :, 1:] = 0.8 * field[t - 1, :, :-1]
        field[t] += rng.standard_normal((6, 5))
    plain = HybridLIM.fit(field, LATS, 1, neighbours=False, max_modes=3)
    assert plain.neighbours is None
    full = HybridLIM.fit(field, LATS, 1, max_modes=3)
    np.testing.assert_allclose(full.residual.r, plain.residual.r)
    last = field[-3:]
    assert full.neighbours is not None
    extra = full.neighbours.predict(full.lim.residual(last), full.lim.mask)
    assert np.abs(extra).max() > 0.1
    np.testing.assert_allclose(full.predict(last), plain.predict(last) + extra)


def test_lim_fits_when_lapack_svd_does_not_converge(monkeypatch):
    # single-threaded OpenBLAS's SVD failed on some HadISST training windows: the fallback gives the same model
    from utils.baselines import LinearInverseModel

    rng = np.random.default_rng(4)
    field = rng.standard_normal((200, 6, 5)).cumsum(axis=0) * 0.1
    ref = LinearInverseModel.fit(field, LATS, max_modes=4)

    def no_convergence(*a, **kw):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setattr(np.linalg, "svd", no_convergence)
    lim = LinearInverseModel.fit(field, LATS, max_modes=4)
    assert lim.modes == ref.modes and lim.explained == pytest.approx(ref.explained)
    np.testing.assert_allclose(lim.predict(field[-3:], 2), ref.predict(field[-3:], 2), atol=1e-8)
