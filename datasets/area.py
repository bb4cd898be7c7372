"""A rectangular lon/lat area, the seed's `Area('Global', lon=[-180, 180], lat=[-80, 80])`.

Longitudes may be given in [-180, 180] or [0, 360]; an area may cross the dateline: Niño 3.4 is
`lon=[170, -120]` (west edge 170°E, east edge 120°W), 70° wide. Edges are read west -> east.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LON_LIMITS = (-180.0, 360.0)  # either convention: [-180, 180] or [0, 360]
LAT_LIMITS = (-90.0, 90.0)


class Area:
    """A lon/lat box. `lon=[west, east]`, `lat=[south, north]`, all in degrees.

    `width` is the eastward span from west to east (wrapping at the dateline); `height` is north - south.
    A full circle is written `[-180, 180]` or `[0, 360]` (width 360).
    """

    def __init__(
        self,
        title: str,
        lon: Sequence[float],
        lat: Sequence[float],
        description: str = "",
    ) -> None:
        if len(lon) != 2 or len(lat) != 2:
            raise ValueError(f"Area {title!r}: lon and lat must be [west, east] and [south, north], got {lon}, {lat}")
        west, east = float(lon[0]), float(lon[1])
        south, north = float(lat[0]), float(lat[1])
        for name, v in (("west", west), ("east", east)):
            if not (LON_LIMITS[0] <= v <= LON_LIMITS[1]) or not np.isfinite(v):
                raise ValueError(f"Area {title!r}: {name} longitude {v} is outside [-180, 360]")
        if not (LAT_LIMITS[0] <= south < north <= LAT_LIMITS[1]):
            raise ValueError(
                f"Area {title!r}: lat must be [south, north] with -90 <= south < north <= 90, got {list(lat)}"
            )
        if west == east:
            raise ValueError(f"Area {title!r}: lon=[{west}, {east}] has zero width; use [-180, 180] for a full circle")
        self.title = title
        self.lon = [west, east]
        self.lat = [south, north]
        self.description = description

    @property
    def width(self) -> float:
        """Longitude span in degrees, measured eastward from the west edge (360 for a full circle)."""
        west, east = self.lon
        span = east - west
        if span >= 360.0:  # [-180, 180] and [0, 360] are full circles
            return 360.0
        return span if span > 0 else span + 360.0  # east < west: the area crosses the dateline

    @property
    def height(self) -> float:
        """Latitude span in degrees."""
        return self.lat[1] - self.lat[0]

    @property
    def crosses_dateline(self) -> bool:
        west, east = self.lon
        return east < west

    def contains_lon(self, lon: np.ndarray) -> np.ndarray:
        """Boolean mask of longitudes (any convention) inside [west, east) going eastward."""
        return self.lon_offset(lon) < self.width

    def lon_offset(self, lon: np.ndarray) -> np.ndarray:
        """Eastward distance in degrees from the west edge, in [0, 360)."""
        return np.mod(np.asarray(lon, dtype=np.float64) - self.lon[0], 360.0)

    def __repr__(self) -> str:
        return f"Area({self.title!r}, lon={self.lon}, lat={self.lat}, description={self.description!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Area) and (self.title, self.lon, self.lat) == (
            other.title,
            other.lon,
            other.lat,
        )

    def __hash__(self) -> int:
        return hash((self.title, tuple(self.lon), tuple(self.lat)))


# Areas the seeds and examples use.
GLOBAL = Area("Global", lon=[-180, 180], lat=[-80, 80], description="Global ocean without the polar caps")
NINO34 = Area("Nino3.4", lon=[170, -120], lat=[-5, 5], description="Niño 3.4 box, crosses the dateline")
