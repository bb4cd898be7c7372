"""The fault campaign of tests/fault_campaign.py with small N: no fault may lose a run.

kill -9 and SIGTERM at random moments (each resumed with `--resume RUN_DIR` alone / the printed command and
compared bit for bit with an uninterrupted run), NaN input / NaN forward / NaN every step / --lr 1000, the
run-name collisions and the lock, every kind of bad input, and the elastic restart under torchrun (gloo).
The cases that run subprocesses run side by side in threads (they mostly wait); the in-process ones run in the
main thread meanwhile. The kill/signal moments are random steps or last.pt writes (the seed is printed on
failure; PLAINLOOP_FAULTS_SEED repeats it): the run stops there, writes a marker file and waits for the kill or
signal, so a slow or loaded machine changes when a case runs, never what it tests. The larger campaign: `python -m tests.fault_campaign`
(benchmarks/results/faults_cpu.md).
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fault_campaign import Campaign, Case, message_lines

pytest.importorskip("netCDF4")
pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PLAINLOOP_FAULTS_SEED", random.randrange(10**6)))


def counted(make, tries: int = 2) -> Case:
    """The elastic case kills a worker as the first checkpoint appears (torchrun's workers cannot be held there):
    a kill that came after the run had finished tests nothing, so it draws again."""
    case = make(0)
    for i in range(1, tries):
        if case.info.get("counted", True):
            break
        case = make(i)
    return case


@pytest.fixture(scope="module")
def results(tmp_path_factory, era5_cache) -> dict[str, Case | list[Case]]:
    camp = Campaign(
        tmp_path_factory.mktemp("faults"), epochs=3, seed=SEED, log=lambda s: None, inprocess=True, events=True
    )
    out: dict[str, Case | list[Case]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            "elastic": pool.submit(counted, lambda i: camp.elastic_case(i, ())),
            "kill": pool.submit(camp.kill_case, 0, mid_write=True),  # held in a write of last.pt, killed there
            "signal": pool.submit(camp.signal_case, 0, "SIGTERM"),
            "same_name": pool.submit(camp.collision_simultaneous, True),
            "default_names": pool.submit(camp.collision_simultaneous, False),
        }
        # in-process cases (stdout is redirected: one at a time, in this thread) while those run
        for mode in ("input", "output", "always", "lr1000"):
            out[f"nan-{mode}"] = camp.nan_case(mode)
        out["reuse"] = camp.collision_reuse_name()
        out["lock"] = camp.collision_lock()
        out["bad"] = camp.bad_inputs()
        out["hostile"] = camp.hostile_inputs()
        out["user_dir"] = camp.user_directory_case()
        out.update({k: f.result() for k, f in futures.items()})
    # the second wave: resume robustness, a live run beside --resume auto, SIGHUP, a signal during set-up
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            "resume-config_empty": pool.submit(camp.resume_case, "config_empty"),
            "resume-batch_size": pool.submit(camp.resume_case, "batch_size"),
            "resume-finished": pool.submit(camp.resume_case, "finished"),
            "sighup": pool.submit(camp.signal_case, 100, "SIGHUP"),
            "setup": pool.submit(camp.setup_signal_case, "SIGTERM", 0.0),  # as soon as the process can answer it
        }
        out["auto_live"] = camp.resume_auto_live_case()
        out.update({k: f.result() for k, f in futures.items()})
    return out


def explain(case: Case) -> str:
    return f"{case.kind} {case.name}: {case.detail} (PLAINLOOP_FAULTS_SEED={SEED}; {case.info})"


def test_kill9_mid_write_then_resume_alone_is_bit_identical_and_tidy(results):
    """Killed while a checkpoint temp file was being written (a random write of last.pt, half written): last.pt
    still loads, the resume ends bit-identical, and the orphan temp file is gone after it."""
    case = results["kill"]
    assert case.info.get("counted", True), explain(case)
    assert case.ok and not case.lost, explain(case)
    assert case.info["mid_write"] and case.info["orphans_after_kill"], explain(case)


def test_sigterm_saves_and_the_printed_command_resumes_bit_identical(results):
    case = results["signal"]
    assert case.info.get("counted", True), explain(case)
    assert case.ok and not case.lost, explain(case)
    assert case.info["exit"] == 143
    assert "--resume" in case.info["resume_command"]


@pytest.mark.parametrize("mode", ["input", "output", "always", "lr1000"])
def test_non_finite_steps_are_caught(results, mode):
    case = results[f"nan-{mode}"]
    assert case.ok, explain(case)
    if mode in ("input", "output"):
        assert case.info["exit"] == 0 and case.info["skipped_steps"] == 1
    if mode == "always":
        assert case.info["exit"] == 3


def test_reused_run_name_never_touches_the_finished_run(results):
    case = results["reuse"]
    assert case.ok and not case.lost, explain(case)


@pytest.mark.parametrize("key", ["same_name", "default_names"])
def test_simultaneous_launches_get_their_own_directories(results, key):
    case = results[key]
    assert case.ok and not case.lost, explain(case)


def test_a_second_live_process_on_one_run_directory_is_refused(results):
    case = results["lock"]
    assert case.ok, explain(case)
    assert case.info["second_exit"] == 2


RESUME_FILE_CASES = (
    "--resume random bytes",
    "--resume pickle payload",
)  # a checkpoint file outside a run dir


def test_every_bad_input_is_exit_2_with_a_short_message(results):
    cases = [c for c in results["bad"] if c.name not in RESUME_FILE_CASES]
    assert len(cases) >= 11
    bad = [explain(c) for c in cases if not c.ok]
    assert not bad, "\n".join(bad)
    for c in results["bad"]:  # whatever the message, exit 2 and no traceback
        assert c.info["exit"] == 2 and "traceback" not in c.detail, explain(c)


def test_a_bad_checkpoint_file_given_to_resume_is_named(results):
    cases = [c for c in results["bad"] if c.name in RESUME_FILE_CASES]
    assert len(cases) == 2 and all(c.ok for c in cases), "\n".join(explain(c) for c in cases)


def test_elastic_restart_under_torchrun_ends_bit_identical(results):
    case = results["elastic"]
    assert case.info.get("counted", True), explain(case)
    assert case.ok and not case.lost, explain(case)


def test_message_lines_drops_the_argparse_usage_block():
    err = (
        "usage: train_optimized.py [-h] [--task {era5,reid}]\n    [--data_path DATA_PATH]\n"
        "train_optimized.py: error: argument --batch_size: 0 is not a positive integer\n"
    )
    assert message_lines(err) == ["train_optimized.py: error: argument --batch_size: 0 is not a positive integer"]


def test_hostile_values_are_refused_with_one_line_before_any_run_directory(results):
    bad = [explain(c) for c in results["hostile"] if not c.ok]
    assert len(results["hostile"]) >= 20 and not bad, "\n".join(bad)


@pytest.mark.parametrize("what", ["config_empty", "batch_size", "finished"])
def test_resume_never_depends_on_one_fragile_file(results, what):
    """config.toml emptied: settings from the checkpoint; a changed batch size: refused, nothing changed; a finished
    run whose file times were lost: recognised from its checkpoint, never scored again."""
    case = results[f"resume-{what}"]
    assert case.info.get("counted", True), explain(case)
    assert case.ok and not case.lost, explain(case)


def test_a_users_directory_and_a_live_run_are_left_alone(results):
    for key in ("user_dir", "auto_live"):
        assert results[key].ok and not results[key].lost, explain(results[key])


def test_sighup_saves_and_resumes_bit_identical(results):
    case = results["sighup"]
    assert case.info.get("counted", True), explain(case)
    assert case.ok and case.info["exit"] == 129, explain(case)


def test_a_signal_during_set_up_is_one_line(results):
    case = results["setup"]
    assert case.ok, explain(case)
