"""Shared fixtures: one cache directory for the generated ERA5 sample file across the whole session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def era5_cache(tmp_path_factory):
    """PLAINLOOP_CACHE for tests that use the built-in sample data (generated once per session)."""
    d = tmp_path_factory.mktemp("plainloop-cache")
    old = os.environ.get("PLAINLOOP_CACHE")
    os.environ["PLAINLOOP_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("PLAINLOOP_CACHE", None)
    else:
        os.environ["PLAINLOOP_CACHE"] = old
