import numpy as np
import pytest

from datasets.area import Area


def test_global_area_matches_seed_shape():
    area = Area("Global", lon=[-180, 180], lat=[-80, 80], description="全球区域")
    assert (area.width, area.height) == (360.0, 160.0)
    assert (int(area.width / 2), int(area.height / 2)) == (180, 80)  # the seed's width/height at 2°
    assert area.title == "Global" and area.description == "全球区域"


@pytest.mark.parametrize(
    "lon, width",
    [([170, -120], 70.0), ([-180, 180], 360.0), ([0, 360], 360.0), ([190, 240], 50.0), ([350, 10], 20.0)],
)
def test_width_wraps_at_dateline(lon, width):
    assert Area("a", lon=lon, lat=[-5, 5]).width == width


def test_lon_offset_and_contains_across_dateline():
    nino = Area("Nino3.4", lon=[170, -120], lat=[-5, 5])
    assert nino.crosses_dateline
    lons = np.array([170.0, 180.0, -180.0, 200.0, -121.0, -120.0, 0.0, 169.0])
    np.testing.assert_array_equal(nino.contains_lon(lons), [True, True, True, True, True, False, False, False])
    np.testing.assert_allclose(nino.lon_offset(np.array([190.0, -170.0])), [20.0, 20.0])


@pytest.mark.parametrize(
    "lon, lat, match",
    [
        ([0, 10], [10, -10], "south < north"),
        ([0, 0], [0, 10], "zero width"),
        ([0, 400], [0, 10], "outside"),
        ([0], [0, 10], "lon and lat"),
    ],
)
def test_bad_area_says_what_is_wrong(lon, lat, match):
    with pytest.raises(ValueError, match=match):
        Area("bad", lon=lon, lat=lat)
