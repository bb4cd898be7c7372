"""The fault campaign of benchmarks/faults.py with small N: no fault may lose a run.

kill -9 and a signal at random moments (each resumed with `--resume RUN_DIR` alone / the printed command and
compared bit for bit with an uninterrupted run), NaN input / NaN forward / NaN every step / --lr 1000, the
run-name collisions and the lock, every kind of bad input, and the elastic restart under torchrun (gloo).
The kill/signal moments are random: the seed is printed on failure (PLAINLOOP_FAULTS_SEED repeats it).
The larger campaign: `python -m benchmarks.faults` (benchmarks/results/faults_cpu.md).
"""

from __future__ import annotations

import os
import random

import pytest

from benchmarks.faults import Campaign, message_lines

pytest.importorskip("netCDF4")
pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PLAINLOOP_FAULTS_SEED", random.randrange(10**6)))


@pytest.fixture(scope="module")
def camp(tmp_path_factory, era5_cache):
    c = Campaign(tmp_path_factory.mktemp("faults"), epochs=10, seed=SEED, log=lambda s: None, inprocess=True)
    c.reference()
    return c


def explain(case) -> str:
    return f"{case.kind} {case.name}: {case.detail} (PLAINLOOP_FAULTS_SEED={SEED}; logs in {case.info})"


def counted_case(make, tries: int = 3):
    """A kill or signal that came after the run had finished is not a test of anything: draw again."""
    for _ in range(tries):
        case = make()
        if case.info.get("counted", True):
            return case
    pytest.fail(f"{tries} draws all came after the run ended")


def test_kill9_at_a_random_moment_then_resume_alone_is_bit_identical(camp):
    case = counted_case(lambda: camp.kill_case(len(camp.cases)))
    assert case.ok and not case.lost, explain(case)


def test_sigterm_saves_and_the_printed_command_resumes_bit_identical(camp):
    case = counted_case(lambda: camp.signal_case(len(camp.cases), "SIGTERM"))
    assert case.ok and not case.lost, explain(case)
    assert case.info["exit"] == 143
    assert "--resume" in case.info["resume_command"]


@pytest.mark.parametrize("mode", ["input", "output", "always", "lr1000"])
def test_non_finite_steps_are_caught(camp, mode):
    case = camp.nan_case(mode)
    assert case.ok, explain(case)
    if mode in ("input", "output"):
        assert case.info["exit"] == 0 and case.info["skipped_steps"] == 1
    if mode == "always":
        assert case.info["exit"] == 3


def test_reused_run_name_never_touches_the_finished_run(camp):
    case = camp.collision_reuse_name()
    assert case.ok and not case.lost, explain(case)


@pytest.mark.parametrize("same_name", [True, False])
def test_simultaneous_launches_get_their_own_directories(camp, same_name):
    case = camp.collision_simultaneous(same_name)
    assert case.ok and not case.lost, explain(case)


def test_a_second_live_process_on_one_run_directory_is_refused(camp):
    case = camp.collision_lock()
    assert case.ok, explain(case)
    assert case.info["second_exit"] == 2


def test_every_bad_input_is_exit_2_with_a_short_message(camp):
    cases = camp.bad_inputs()
    assert len(cases) >= 12
    bad = [explain(c) for c in cases if not c.ok]
    assert not bad, "\n".join(bad)


def test_elastic_restart_under_torchrun_ends_bit_identical(camp):
    case = counted_case(lambda: camp.elastic_case(len(camp.cases)), tries=2)
    assert case.ok and not case.lost, explain(case)


def test_message_lines_drops_the_argparse_usage_block():
    err = (
        "usage: train_optimized.py [-h] [--task {era5,reid}]\n    [--data_path DATA_PATH]\n"
        "train_optimized.py: error: argument --batch_size: 0 is not a positive integer\n"
    )
    assert message_lines(err) == [
        "train_optimized.py: error: argument --batch_size: 0 is not a positive integer"
    ]
