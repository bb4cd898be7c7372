"""Real spherical harmonics: closed forms, orthonormality by quadrature, stability at high degree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.spherical_harmonics import num_harmonics, real_spherical_harmonics


def _col(l: int, m: int) -> int:  # noqa: E741
    return l * l + l + m


def test_low_degrees_match_closed_forms() -> None:
    g = torch.Generator().manual_seed(0)
    lat = torch.rand(200, generator=g, dtype=torch.float64) * 180 - 90
    lon = torch.rand(200, generator=g, dtype=torch.float64) * 360 - 180
    Y = real_spherical_harmonics(lat, lon, 2, dtype=torch.float64)
    assert Y.shape == (200, num_harmonics(2)) == (200, 9)
    phi, lam = torch.deg2rad(lat), torch.deg2rad(lon)
    s, c = torch.sin(phi), torch.cos(phi)
    pi = math.pi
    expected = {
        (0, 0): torch.full_like(s, 1 / math.sqrt(4 * pi)),
        (1, -1): math.sqrt(3 / (4 * pi)) * c * torch.sin(lam),
        (1, 0): math.sqrt(3 / (4 * pi)) * s,
        (1, 1): math.sqrt(3 / (4 * pi)) * c * torch.cos(lam),
        (2, -2): math.sqrt(15 / (16 * pi)) * c**2 * torch.sin(2 * lam),
        (2, -1): math.sqrt(15 / (4 * pi)) * s * c * torch.sin(lam),
        (2, 0): math.sqrt(5 / (16 * pi)) * (3 * s**2 - 1),
        (2, 1): math.sqrt(15 / (4 * pi)) * s * c * torch.cos(lam),
        (2, 2): math.sqrt(15 / (16 * pi)) * c**2 * torch.cos(2 * lam),
    }
    for (l, m), ref in expected.items():  # noqa: E741
        torch.testing.assert_close(Y[:, _col(l, m)], ref, rtol=1e-12, atol=1e-12, msg=f"Y_{l}^{m}")


@pytest.mark.parametrize("max_degree", [3, 10])
def test_orthonormal_by_gauss_legendre_quadrature(max_degree: int) -> None:
    # Gauss-Legendre in x = sin(lat) is exact for polynomials of degree 2n-1 (products reach 2L), and an
    # M-point uniform rule in longitude is exact for trigonometric frequencies < M (products reach 2L).
    n_lat, n_lon = max_degree + 2, 2 * max_degree + 4
    x, w = np.polynomial.legendre.leggauss(n_lat)
    lat = np.degrees(np.arcsin(x))
    lon = np.arange(n_lon) * 360.0 / n_lon
    lat_g, lon_g = np.meshgrid(lat, lon, indexing="ij")
    weights = torch.from_numpy((w[:, None] * np.full(n_lon, 2 * np.pi / n_lon)[None, :]).reshape(-1))
    Y = real_spherical_harmonics(torch.from_numpy(lat_g), torch.from_numpy(lon_g), max_degree, torch.float64)
    gram = Y.T @ (Y * weights[:, None])
    torch.testing.assert_close(gram, torch.eye(num_harmonics(max_degree), dtype=torch.float64), atol=1e-10, rtol=0)


def test_orthonormal_on_fine_latlon_grid_with_cos_weights() -> None:
    # The cell-area rule (cos-latitude weights on a regular grid) is only approximate: a looser tolerance.
    L = 6
    lat = torch.linspace(-90, 90, 361, dtype=torch.float64)[:-1] + 0.25  # cell centres, 0.5 deg
    lon = torch.arange(720, dtype=torch.float64) * 0.5
    lat_g, lon_g = torch.meshgrid(lat, lon, indexing="ij")
    Y = real_spherical_harmonics(lat_g.reshape(-1), lon_g.reshape(-1), L, torch.float64)
    d = math.radians(0.5)
    w = (torch.cos(torch.deg2rad(lat_g)) * d * d).reshape(-1)
    gram = Y.T @ (Y * w[:, None])
    torch.testing.assert_close(gram, torch.eye(num_harmonics(L), dtype=torch.float64), atol=2e-4, rtol=0)


def test_degree_60_is_finite_and_obeys_addition_theorem() -> None:
    # Includes both poles and the equator, where unnormalised recurrences overflow or underflow badly.
    lat = torch.tensor([-90.0, -89.9, -45.0, 0.0, 12.3, 60.0, 89.9, 90.0], dtype=torch.float64)
    lon = torch.tensor([0.0, 10.0, -170.0, 45.0, 180.0, 359.0, 7.0, 0.0], dtype=torch.float64)
    L = 60
    Y = real_spherical_harmonics(lat, lon, L, torch.float64)
    assert Y.shape == (8, 61 * 61)
    assert torch.isfinite(Y).all()
    # Unsold's theorem: sum over m of Y_l^m(p)^2 = (2l+1)/(4 pi) at every point, for every l.
    for l in (0, 1, 7, 30, 59, 60):  # noqa: E741
        s = Y[:, l * l : (l + 1) * (l + 1)].square().sum(dim=1)
        torch.testing.assert_close(s, torch.full_like(s, (2 * l + 1) / (4 * math.pi)), rtol=1e-9, atol=0)
    # The float32 cast the model uses stays finite too.
    assert torch.isfinite(real_spherical_harmonics(lat, lon, L)).all()


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="max_degree"):
        real_spherical_harmonics(torch.zeros(3), torch.zeros(3), -1)
    with pytest.raises(ValueError, match="points"):
        real_spherical_harmonics(torch.zeros(3), torch.zeros(4), 2)
    with pytest.raises(ValueError, match=r"\[-90, 90\]"):
        real_spherical_harmonics(torch.tensor([120.0]), torch.tensor([0.0]), 2)
    with pytest.raises(ValueError, match="NaN"):
        real_spherical_harmonics(torch.tensor([float("nan")]), torch.tensor([0.0]), 2)
