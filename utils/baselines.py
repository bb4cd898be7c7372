"""Statistical SST forecasts that a learned model must beat, fitted on the training months only (numpy only).

    anom = train_c - clim_c[months % 12]                     # (T, H, W) °C anomalies of the training months
    dp = DampedPersistence.fit(anom, lead=3, mask=ocean)      # per-cell lag-3 autocorrelation
    lim = LinearInverseModel.fit(anom, lats, mask=ocean)      # EOFs + one-month propagator G(1)
    f_dp = clim_target + dp.predict(last_anom)                # forecasts 3 months after the last input month
    f_lim = clim_target + lim.predict(last_anom, lead=3)      # LIM: G(1)^3 applied to the last state

Leads count months from the last input month to the target month (the dataset's `offset + 1`).

- Damped anomaly persistence: a'(t + k) = r_k · a'(t) with r_k the lag-k autocorrelation of each cell's
  training anomalies. For an AR(1) cell with coefficient φ, r_k → φ^k.
- Linear inverse model (Penland & Sardeshmukh 1995): anomalies weighted by sqrt(cos φ) are truncated to the
  leading EOFs; the principal components x obey dx/dt = L x + noise, fitted from the lag covariances
  G(τ0) = C(τ0) C(0)⁻¹ with τ0 = 1 month; a k-month forecast is G(τ0)^k x (= exp(L k τ0) x). The truncation
  keeps the EOFs that explain `variance` of the variance, at most `max_modes` and at most a tenth of the
  training months, so the propagator's m² numbers stay well determined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def _check_anoms(anom: np.ndarray, mask: np.ndarray | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(anom, dtype=np.float64)
    if a.ndim != 3:
        raise ValueError(f"{what}: anomalies must be (T, H, W), got shape {a.shape}")
    m = np.isfinite(a).all(axis=0) if mask is None else np.asarray(mask, dtype=bool)
    if m.shape != a.shape[1:]:
        raise ValueError(f"{what}: mask shape {m.shape} does not match the fields {a.shape[1:]}")
    if not m.any():
        raise ValueError(f"{what}: no ocean cell to fit")
    if not np.isfinite(a[:, m]).all():
        raise ValueError(f"{what}: training anomalies are not finite on every ocean cell (land must be masked)")
    return a, m


@dataclass
class DampedPersistence:
    """Per-cell damping factor r_k (H, W) for one lead k; NaN off the mask."""

    lead: int
    r: np.ndarray

    @classmethod
    def fit(cls, anom: np.ndarray, lead: int, mask: np.ndarray | None = None) -> DampedPersistence:
        """Lag-`lead` autocorrelation of each cell's training anomalies (T, H, W)."""
        a, m = _check_anoms(anom, mask, "DampedPersistence.fit")
        if int(lead) != lead or lead < 1:
            raise ValueError(f"DampedPersistence.fit: lead={lead} must be an integer >= 1 (months)")
        if a.shape[0] <= lead + 1:
            raise ValueError(f"DampedPersistence.fit: {a.shape[0]} training months are too few for lead {lead}")
        x0, x1 = a[:-lead][:, m], a[lead:][:, m]
        num = np.sum(x0 * x1, axis=0)
        den = np.sqrt(np.sum(x0**2, axis=0) * np.sum(x1**2, axis=0))
        r = np.full(m.shape, np.nan)
        r[m] = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        return cls(int(lead), r)

    def predict(self, last_anom: np.ndarray) -> np.ndarray:
        """(N, H, W) anomalies of the last input month -> anomalies `lead` months later."""
        return np.asarray(last_anom, dtype=np.float64) * self.r


@dataclass
class LinearInverseModel:
    """EOF-truncated linear inverse model. `eofs` (m, cells) are orthonormal in the sqrt(cos φ)-weighted
    space; `g1` (m, m) is the one-month propagator of the principal components."""

    mask: np.ndarray  # (H, W) cells used
    sqrt_w: np.ndarray  # (cells,) sqrt(cos φ) weights
    eofs: np.ndarray  # (m, cells)
    g1: np.ndarray  # (m, m)
    explained: float  # fraction of the weighted variance the kept EOFs explain

    @classmethod
    def fit(
        cls,
        anom: np.ndarray,
        lats: np.ndarray,
        mask: np.ndarray | None = None,
        variance: float = 0.9,
        max_modes: int = 20,
        tau0: int = 1,
    ) -> LinearInverseModel:
        """Fit on training anomalies (T, H, W) in consecutive months; `lats` are the H row latitudes."""
        a, m = _check_anoms(anom, mask, "LinearInverseModel.fit")
        if len(lats) != a.shape[1]:
            raise ValueError(f"LinearInverseModel.fit: {len(lats)} latitudes for {a.shape[1]} rows")
        if not 0 < variance <= 1:
            raise ValueError(f"LinearInverseModel.fit: variance={variance} must be in (0, 1]")
        T = a.shape[0]
        if T < 3 * tau0 + 3:
            raise ValueError(f"LinearInverseModel.fit: {T} training months are too few")
        w = np.sqrt(np.clip(np.cos(np.deg2rad(np.asarray(lats, dtype=np.float64))), 0.0, None))
        sqrt_w = np.broadcast_to(w[:, None], m.shape)[m]
        x = a[:, m] * sqrt_w  # (T, cells)
        _, s, vt = np.linalg.svd(x, full_matrices=False)
        frac = np.cumsum(s**2) / max(np.sum(s**2), 1e-300)
        n = int(np.searchsorted(frac, variance - 1e-12) + 1)
        n = max(1, min(n, int(max_modes), max(1, T // 10), vt.shape[0]))
        eofs = vt[:n]
        pcs = x @ eofs.T  # (T, m)
        c0 = pcs[:-tau0].T @ pcs[:-tau0]
        ct = pcs[tau0:].T @ pcs[:-tau0]
        g_tau = ct @ np.linalg.pinv(c0)  # G(τ0) = C(τ0) C(0)^-1, both from the same T - τ0 pairs
        g1 = _fractional_power(g_tau, 1.0 / tau0) if tau0 != 1 else g_tau
        return cls(m, sqrt_w, eofs, g1, float(frac[n - 1]))

    @property
    def modes(self) -> int:
        return int(self.eofs.shape[0])

    def propagator(self, lead: int) -> np.ndarray:
        """G(1)^lead: the principal components `lead` months ahead."""
        if int(lead) != lead or lead < 1:
            raise ValueError(f"LinearInverseModel: lead={lead} must be an integer >= 1 (months)")
        return np.linalg.matrix_power(self.g1, int(lead))

    def predict(self, last_anom: np.ndarray, lead: int) -> np.ndarray:
        """(N, H, W) anomalies of the last input month -> anomalies `lead` months later (NaN off the mask)."""
        a = np.asarray(last_anom, dtype=np.float64)
        squeeze = a.ndim == 2
        a = a[None] if squeeze else a
        pcs = (np.nan_to_num(a[:, self.mask]) * self.sqrt_w) @ self.eofs.T  # (N, m)
        fut = pcs @ self.propagator(lead).T
        out = np.full(a.shape, np.nan)
        out[:, self.mask] = (fut @ self.eofs) / self.sqrt_w
        return out[0] if squeeze else out


def _fractional_power(g: np.ndarray, p: float) -> np.ndarray:
    """G^p through the eigen-decomposition (real part): the one-month propagator from G(τ0)."""
    vals, vecs = np.linalg.eig(g)
    return np.real(vecs @ np.diag(vals.astype(complex) ** p) @ np.linalg.inv(vecs))


BASELINE_NAMES = ("persistence", "climatology", "anomaly_persistence", "damped_persistence", "lim")


def unfitted_forecasts(last_input_c: Any, clim_target_c: Any, clim_input_c: Any) -> dict[str, np.ndarray]:
    """The three °C forecasts that need no fitting: persistence (last input month), climatology (calendar-month
    mean of the target) and anomaly persistence (target climatology + the last input month's anomaly)."""
    last, ct, ci = (np.asarray(v, dtype=np.float64) for v in (last_input_c, clim_target_c, clim_input_c))
    return {"persistence": last, "climatology": ct, "anomaly_persistence": ct + (last - ci)}


def fit_baselines(
    train_anom: np.ndarray, lats: np.ndarray, mask: np.ndarray, lead: int, **lim_kw: Any
) -> dict[str, Any]:
    """The fitted statistical baselines for one lead: {"damped_persistence": ..., "lim": ...}."""
    return {
        "damped_persistence": DampedPersistence.fit(train_anom, lead, mask),
        "lim": LinearInverseModel.fit(train_anom, lats, mask, **lim_kw),
    }


def baseline_forecasts(
    fitted: dict[str, Any],
    lead: int,
    last_input_c: np.ndarray,
    clim_target_c: np.ndarray,
    clim_input_c: np.ndarray,
) -> dict[str, np.ndarray]:
    """°C forecasts (N, H, W) of every baseline for targets `lead` months after the last input month."""
    out = unfitted_forecasts(last_input_c, clim_target_c, clim_input_c)
    ct, anom = out["climatology"], out["persistence"] - np.asarray(clim_input_c, dtype=np.float64)
    out["damped_persistence"] = ct + fitted["damped_persistence"].predict(anom)
    out["lim"] = ct + fitted["lim"].predict(anom, lead)
    return out
