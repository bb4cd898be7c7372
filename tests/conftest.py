"""Shared fixtures: one cache directory for the generated ERA5 sample file across the whole session, one torch
thread for tiny models, a scratch working directory for BaseTrainer. Plain helpers are in tests/helpers.py."""

from __future__ import annotations

import os
import signal

# The suite tests plainloop's own handling of stop signals. A shell that starts it in the background (`cmd &`) or
# under nohup ignores SIGINT or SIGHUP for it, and plainloop rightly keeps a signal ignored at start ignored: the
# tests (and the runs they start) begin from the usual dispositions instead, before trainer/ is imported.
for _name, _usual in (("SIGINT", signal.default_int_handler), ("SIGHUP", signal.SIG_DFL)):
    if hasattr(signal, _name) and signal.getsignal(getattr(signal, _name)) == signal.SIG_IGN:
        signal.signal(getattr(signal, _name), _usual)

import pytest  # noqa: E402
import torch  # noqa: E402

import trainer.base as trainer_base  # noqa: E402
import trainer.compat.base_trainer as base_mod  # noqa: E402

try:  # Hypothesis fails an example slower than 200 ms by default: a timing assertion a loaded machine trips
    from hypothesis import settings

    settings.register_profile("plainloop", deadline=None)
    settings.load_profile("plainloop")
except ImportError:  # the tests that use it say so themselves
    pass


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


@pytest.fixture
def one_thread():
    """One torch thread (a module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    # tiny models on a shared 2-core CPU: one thread is faster than two competing, and deterministic
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, era5_cache):
    """The test runs in tmp_path, and BaseTrainer saves its models under tmp_path/models."""
    monkeypatch.chdir(tmp_path)
    for module in (base_mod, trainer_base):  # the guides import it from trainer.base, which holds its own copy
        monkeypatch.setattr(module, "MODEL_SAVE_PATH", str(tmp_path / "models"))
    return tmp_path
