"""Orthonormal real spherical harmonics on latitude/longitude points.

`real_spherical_harmonics(lat_deg, lon_deg, max_degree)` returns Y_l^m for l = 0..max_degree and
m = -l..l at each point, column index l*l + l + m (so column 0 is Y_0^0, columns 1..3 are
Y_1^-1, Y_1^0, Y_1^1, ...). The functions are orthonormal over the unit sphere:
integral of Y_a * Y_b dOmega = delta_ab.

Convention (no Condon-Shortley phase), with x = sin(lat) and lon in radians:
    m > 0:  Y_l^m  = sqrt(2) * Pbar_l^m(x) * cos(m * lon)
    m = 0:  Y_l^0  =           Pbar_l^0(x)
    m < 0:  Y_l^m  = sqrt(2) * Pbar_l^|m|(x) * sin(|m| * lon)
so Y_1^-1, Y_1^0, Y_1^1 = sqrt(3/4pi) * (y, z, x) of the unit vector.

Pbar_l^m = sqrt((2l+1)/(4pi) * (l-m)!/(l+m)!) * P_l^m is built by the standard stable recurrence for
fully normalised associated Legendre functions (e.g. Holmes & Featherstone 2002), so no factorial is
ever formed and high degrees neither overflow nor lose precision:
    Pbar_0^0     = 1/sqrt(4pi)
    Pbar_m^m     = sqrt((2m+1)/(2m)) * cos(lat) * Pbar_{m-1}^{m-1}      (sectoral)
    Pbar_{m+1}^m = sqrt(2m+3) * x * Pbar_m^m
    Pbar_l^m     = a_lm * (x * Pbar_{l-1}^m - b_lm * Pbar_{l-2}^m),
        a_lm = sqrt((4l^2-1)/(l^2-m^2)),  b_lm = sqrt(((l-1)^2-m^2)/(4(l-1)^2-1)).
Everything is computed in float64 and cast at the end. Only torch is needed (no scipy), so the file can be
copied into another project as is.
"""

from __future__ import annotations

import math

import torch


def num_harmonics(max_degree: int) -> int:
    """Number of real harmonics up to and including `max_degree`: (max_degree + 1) ** 2."""
    return (max_degree + 1) ** 2


def real_spherical_harmonics(
    lat_deg: torch.Tensor | float,
    lon_deg: torch.Tensor | float,
    max_degree: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Real orthonormal spherical harmonics at N points.

    Args:
        lat_deg: latitudes in degrees, shape (N,) (or anything that flattens to N), within [-90, 90].
        lon_deg: longitudes in degrees, same number of points; any range (periodic).
        max_degree: highest degree L >= 0.
        dtype: dtype of the result (the computation itself runs in float64).

    Returns:
        Tensor of shape (N, (L+1)**2); column l*l + l + m holds Y_l^m.
    """
    if isinstance(max_degree, bool) or not isinstance(max_degree, int) or max_degree < 0:
        raise ValueError(
            f"spherical_harmonics: max_degree must be an int >= 0, got {max_degree!r} "
            "(pass e.g. max_degree=8 for 81 features)"
        )
    lat = torch.as_tensor(lat_deg, dtype=torch.float64).reshape(-1).cpu()
    lon = torch.as_tensor(lon_deg, dtype=torch.float64).reshape(-1).cpu()
    if lat.shape != lon.shape:
        raise ValueError(
            f"spherical_harmonics: lat_deg has {lat.numel()} points but lon_deg has {lon.numel()}; "
            "pass one (lat, lon) pair per point"
        )
    if not bool(torch.isfinite(lat).all()) or not bool(torch.isfinite(lon).all()):
        raise ValueError("spherical_harmonics: lat_deg/lon_deg contain NaN or inf; pass finite coordinates")
    if lat.numel() and (float(lat.min()) < -90.0 or float(lat.max()) > 90.0):
        raise ValueError(
            f"spherical_harmonics: latitudes must lie in [-90, 90], got range "
            f"[{float(lat.min())}, {float(lat.max())}]; did you swap lat and lon?"
        )

    L = max_degree
    phi = torch.deg2rad(lat)
    lam = torch.deg2rad(lon)
    x = torch.sin(phi)
    # cos(lat) >= 0 on [-90, 90]; clamp protects against a tiny negative from rounding at the poles.
    c = torch.cos(phi).clamp_min(0.0)

    out = torch.empty(lat.numel(), num_harmonics(L), dtype=torch.float64)
    sqrt2 = math.sqrt(2.0)
    p_mm = torch.full_like(x, 1.0 / math.sqrt(4.0 * math.pi))  # Pbar_0^0
    for m in range(L + 1):
        if m > 0:
            # Sectoral step: one multiplication by cos(lat) per order, values shrink like cos(lat)^m
            # (harmless underflow towards the poles, never overflow).
            p_mm = math.sqrt((2 * m + 1) / (2 * m)) * c * p_mm
        cos_m = sqrt2 * torch.cos(m * lam)  # read only for m > 0
        sin_m = sqrt2 * torch.sin(m * lam)

        p_prev2 = p_mm  # Pbar_{l-2}^m: first read at l = m + 2, after the shift below has set it
        p_prev = p_mm  # Pbar_{l-1}^m, starting at l = m
        for l in range(m, L + 1):  # noqa: E741 - l is the conventional name of the degree
            if l == m:
                p_l = p_mm
            elif l == m + 1:
                p_l = math.sqrt(2 * m + 3) * x * p_mm
            else:
                a = math.sqrt((4 * l * l - 1) / (l * l - m * m))
                b = math.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
                p_l = a * (x * p_prev - b * p_prev2)
            if l > m:
                p_prev2, p_prev = p_prev, p_l
            base = l * l + l
            if m == 0:
                out[:, base] = p_l
            else:
                out[:, base + m] = p_l * cos_m
                out[:, base - m] = p_l * sin_m
    return out.to(dtype)
