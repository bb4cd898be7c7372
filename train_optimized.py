#!/usr/bin/env python
"""plainloop command line: train a built-in task with every speed-up on by default.

    python train_optimized.py                                   # ERA5 SST demo on the built-in sample data
    python train_optimized.py --batch_size 8 --num_workers 16 --compile_model --validation_interval 20
    python train_optimized.py --config configs/era5.toml --epochs 5          # a config file; flags win
    python train_optimized.py --resume runs/era5-20261122-004404            # continue, with the run's settings
    python train_optimized.py --task reid                       # cross-modality re-ID on the synthetic set
    python train_optimized.py --baseline                        # the unoptimised "before" loop, for comparison
    python train_optimized.py --system_report                   # measured bottleneck report, then exit
    torchrun --nproc_per_node 2 train_optimized.py ...          # DDP (or NPROC_PER_NODE=2 ./optimize_training.sh)

Every flag comes from one place: TrainConfig's fields (trainer/config.py), the task builders' parameters
(tasks/era5.py, tasks/reid.py) and RunOptions below; each value is checked by the rule beside its definition
(trainer/config.py's `check_value`) before anything is written. Exit codes (EXIT_CODES below, also in --help and
docs/guides/cli.md): 0 done, 2 a bad input (one clear line; --debug for the traceback), 3 training diverged, 4 an I/O
failure (a full disk, no permission, the run directory removed), 128 + N stopped by signal N.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import os
import re
import shlex
import signal
import sys
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast


def _early_stop(signum: int, frame: Any) -> None:
    """A stop signal while Python imports torch and the tasks: nothing exists yet; one line and exit."""
    os.write(2, f"[plainloop] {signal.Signals(signum).name} during start-up: stopped before training; nothing to "
                f"resume\n".encode())  # fmt: skip
    os._exit(128 + signum)


SETUP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP") if hasattr(signal, n))
if __name__ == "__main__":  # run as a program (not imported): covered from the first line on
    for _s in SETUP_SIGNALS:
        if signal.getsignal(_s) != signal.SIG_IGN:  # ignored at start (nohup's SIGHUP): stays ignored
            signal.signal(_s, _early_stop)
    # This checkout installed (pip install -e, as the set-up scripts do): run as the package plainloop._app, so that
    # plainloop's tasks/, utils/, datasets/, models/ and trainer/ take none of those names from a user's task.
    try:
        import plainloop._app as _app

        _delegate = _app.installed_here(__file__)
    except ImportError:  # not installed: the folders' own names, as before
        _delegate = False
    if _delegate:
        if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
            del sys.path[0]  # this folder: under the package its tasks/ and utils/ need no top-level name
        # a "spawn" worker runs the app's module, not this file again with its plain imports
        sys.modules["__main__"].__spec__ = importlib.util.find_spec(_app.rename("train_optimized"))
        sys.exit(_app.main())

import torch  # noqa: E402

from tasks import (  # noqa: E402
    ERA5_MODEL_KEYS,
    TASK_BUILDERS,
    build_task,
    check_task_name,
    find_resumable_user_task,
    is_user_task,
    register_user_task,
    resolve_task_args,
    resume_config,
    spec_from_argv,
    task_module,
    train_defaults,
    user_train_defaults,
)
from trainer.checkpoint import STORAGE_ERRNOS, CheckpointError, StorageError  # noqa: E402
from trainer.cli.command import cli_command, cli_session, installed_command, peek_checkpoint, set_task_flag  # noqa: E402
from trainer.cli.options import (  # noqa: E402
    add_dataclass_arguments,
    add_function_arguments,
    add_help_flags,
    function_parameters,  # fmt: skip
    load_config_file,
)
from trainer.config import (  # noqa: E402
    ConfigError,
    Rules,
    TrainConfig,
    check_output_dirs,
    check_settings,
    field_rules,
    knob,
)
from trainer.extras.loggers import CSVLogger, WandbLogger, parse_logger_names  # noqa: E402
from trainer.runfiles import RunDirError, refuse_if_live, resume_auto  # noqa: E402
from trainer.runtime import launch_prefix  # noqa: E402
from trainer.signals import handled_signals  # noqa: E402
from trainer.state import ResumeError, RunFinished, SettingsChanged, check_resume  # noqa: E402
from trainer.usercode import resume_hint  # noqa: E402

RUN = "task and run"
TOOLS = "measurement tools"


@dataclass
class RunOptions:
    """Settings of the command line itself: which task, which files, which tools around the loop."""

    task: str = knob(
        "era5",
        "what to train: era5, reid, or your own builder as package.module:function (or path/to/file.py:function); "
        "its parameters become flags (--help --task module:function lists them)",
        RUN,
        metavar="{era5,reid,MODULE:FUNCTION}",
    )
    config: str | None = knob(
        None,
        "a .toml/.json/.yaml file of settings, keys = flag names (mmseg config names too); flags given here win",
        RUN,
    )
    preset: str = knob(
        "auto",
        "ERA5 model/grid preset: full = the full-size model (2 deg grid, d_model 512, 3 layers); cpu = "
        "reduced (5 deg, d_model 64, 1 layer); auto = full on a GPU, cpu otherwise. Explicit flags override it",
        RUN,
        check=lambda v: None if v in PRESETS else f"not a preset; use one of {', '.join(PRESETS[:3])}",
        metavar="{auto,cpu,full}",
    )
    debug: bool = knob(False, "show the traceback of known errors too (also PLAINLOOP_DEBUG=1)", RUN)
    logger: str = knob(
        "jsonl",
        "extra loggers, a comma list of csv (RUN_DIR/metrics.csv), tensorboard (events in RUN_DIR: "
        "tensorboard --logdir OUTPUT_DIR) and wandb (Weights & Biases; WANDB_MODE=offline needs no network); "
        "metrics.jsonl is always written",
        RUN,
        metavar="csv,tensorboard,wandb",
    )
    plots: bool = knob(True, "write plots after training (needs matplotlib)", RUN)
    monitor_interval: float = knob(
        1.0, "seconds between TrainingMonitor samples of CPU/GPU use", TOOLS, gt=0, max=86400
    )
    profile: bool = knob(False, "write a torch.profiler trace of a few steps into RUN_DIR/profile, then stop", TOOLS)
    profile_then_train: bool = knob(False, "with --profile: go on and train after profiling", TOOLS)
    system_report: bool = knob(
        False,
        "profile this configuration, diagnose the bottleneck, measure recommended "
        "settings, write report.md to the run directory, and exit",
        TOOLS,
    )
    report_steps: int = knob(30, "steps per trial of --system_report", TOOLS, min=1)
    report_repeats: int = knob(
        3, "interleaved repetitions of each --system_report trial (medians reported)", TOOLS, min=1
    )
    price_per_kwh: float | None = knob(
        None, "--system_report: electricity price, to project the job's cost", TOOLS, gt=0
    )
    price_per_gpu_hour: float | None = knob(
        None, "--system_report: price of one GPU hour (cloud), for the projection", TOOLS, gt=0
    )
    currency: str = knob("", "--system_report: currency label of the prices, e.g. EUR", TOOLS, allow_empty=True)
    power_w: float | None = knob(
        None,
        "--system_report: the machine's power draw in watts when NVML/RAPL cannot measure it",
        TOOLS,
        gt=0,
    )
    auto_batch_size: bool = knob(False, "largest batch that fits; keeps the effective batch with accumulation", TOOLS)
    auto_num_workers: bool = knob(False, "measure loader throughput and pick num_workers", TOOLS)
    trust_task: bool = knob(
        False,
        "run the task (module:function or path/to/file.py:function) that --config or the resumed run's config.toml "
        "names without --task naming it too (code named by a run directory or a config file runs only when you say so)",
        RUN,
    )


# "seed": the earlier name of "full", still read (with a note)
PRESETS: tuple[str, ...] = ("auto", "cpu", "full", "seed")
KNOWN_ERRORS = (ConfigError, ResumeError, RunDirError, CheckpointError, OSError, ValueError)
NOT_IN_CONFIG_FILE = ("config", "debug", "resume", "trust_task")  # never written into a run's config.toml
# one table, shown by --help and docs/guides/cli.md
EXIT_CODES = {
    "0": "done (a closed stdout, as with | head, or a signal after summary.json is written does not change it)",
    "2": "bad input: a flag, config file, checkpoint or data (one line)",
    "3": "training diverged: too many non-finite steps skipped (checked at log points and at the end)",
    "4": "I/O failure: a full disk, no permission, the run directory removed (the file is named)",
    "128+N": "stopped by signal N before the run was complete (130 Ctrl-C, 143 SIGTERM); last.pt written when "
    "training had started",
}
EXIT_TEXT = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."
# the short --help: what most runs set; --help GROUP / --help-all show the rest
COMMON_FLAGS = ("task", "config", "data_path", "output_dir", "run_name", "resume", "epochs", "max_steps",
                "batch_size", "lr", "precision", "num_workers", "device", "compile_model", "preset", "debug")  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line (argparse would print its whole usage block, 80 lines, before it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{self.suggest(message)} (--help-all lists every flag)\n")

    def suggest(self, message: str) -> str:
        """ " (--batch_sise: did you mean --batch_size?)" for the misspelt flags of an unrecognized-arguments error."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hints = []
        for word in message.split(":", 1)[1].split():
            name = word.split("=", 1)[0]
            if name.startswith("--") and name not in flags:
                near = difflib.get_close_matches(name, flags, n=1, cutoff=0.75)
                if near:
                    hints.append(f"{name}: did you mean {near[0]}?")
        return f" ({'; '.join(hints)})" if hints else ""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=installed_command() or "train_optimized.py",  # pip's command: plainloop, or python -m plainloop
        usage="%(prog)s [--flag VALUE ...]",
        description="plainloop: fast training in plain PyTorch.",
        epilog=EXIT_TEXT,
        add_help=False,
    )
    add_help_flags(p, COMMON_FLAGS)
    seen: set[str] = set()
    add_dataclass_arguments(p, RunOptions, seen)
    for name, builder in TASK_BUILDERS.items():
        mod = task_module(name)
        add_function_arguments(
            p,
            builder(),
            getattr(mod, "ARGS_HELP", {}),
            f"{name} task",
            skip=("seed", "device_cache", "learning_rate"),
            seen=seen,
            default_text={k: "from --preset" for k in ERA5_MODEL_KEYS} if name == "era5" else {},
            rules=getattr(mod, "ARGS_RULES", {}),
        )
    add_dataclass_arguments(p, TrainConfig, seen)
    for name in TASK_BUILDERS:
        if is_user_task(name):  # its TRAIN_DEFAULTS are the defaults it runs with: show those
            by_dest = {a.dest: a for a in p._actions if a.option_strings}
            try:
                task_defaults = user_train_defaults(name)
            except KNOWN_ERRORS:
                task_defaults = {}  # a bad TRAIN_DEFAULTS is reported by the run, with its own line
            for key, value in task_defaults.items():
                a = by_dest.get(key)
                if a is not None and a.help:
                    text = ("on" if value else "off") if isinstance(value, bool) else str(value).replace("%", "%%")
                    a.help = (
                        re.sub(r"\(default: [^()]*\)$", "", a.help)
                        + f"(default: {text}, from the task's TRAIN_DEFAULTS)"
                    )
    return p


def names() -> dict[str, dict[str, Any]]:
    """{"run" | "train" | task: {flag name: type}} — where each setting belongs."""
    return {group: {k: tp for k, (tp, _) in r.items()} for group, r in rules().items()}


def rules() -> dict[str, Rules]:
    """{"run" | "train" | task: {flag name: (type, rule)}}: every setting's type and rule, from its definition."""
    out = {"run": field_rules(RunOptions), "train": field_rules(TrainConfig)}
    for name, builder in TASK_BUILDERS.items():
        task_rules = getattr(task_module(name), "ARGS_RULES", {})
        out[name] = {k: (tp, dict(task_rules.get(k, {}))) for k, (tp, _) in function_parameters(builder()).items()}
    return out


def all_rules() -> Rules:
    """One {flag name: (type, rule)} over every group (a name two groups share has one rule)."""
    out: Rules = {}
    for group in rules().values():
        for k, v in group.items():
            out.setdefault(k, v)
    return out


# ------------------------------------------------------------------------------------------- settings
def resolve_settings(explicit: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """defaults <- the resumed run's config.toml <- --config file <- flags typed on the command line."""
    known = all_rules()
    file_vals: dict[str, Any] = {}
    if explicit.get("config"):
        where = f"--config {explicit['config']}"
        file_vals = load_config_file(explicit["config"], notes)
        for k in NOT_IN_CONFIG_FILE:
            if k in file_vals:
                raise ConfigError(f"{where}: {k!r} cannot be set in a config file; give --{k} on the command line")
        file_vals = check_settings(file_vals, known, where, notes)
    given = {**file_vals, **explicit}
    resume = given.get("resume")
    saved: dict[str, Any] = {}
    if resume:
        run_dir = _resume_dir(resume, given, notes)
        # a checkpoint file is resumed from itself; its run directory only supplies the saved settings
        file_given = resume != "auto" and Path(resume).is_file()
        given["resume"] = resume if file_given else (str(run_dir) if run_dir else None)
        if run_dir is not None:
            ckpt = Path(given["resume"]) if file_given else run_dir / "checkpoints" / "last.pt"
            # a target that cannot be resumed is said now, alone: not after the settings' notes and the data
            meta = peek_checkpoint(ckpt if file_given else run_dir)
            saved = saved_settings(run_dir, notes, ckpt)
            saved = {k: v for k, v in saved.items() if k not in NOT_IN_CONFIG_FILE}
            saved.pop("run_name", None)
            saved.pop("output_dir", None)
            for k, v in given.items():
                if k in saved and saved[k] != v and k not in NOT_IN_CONFIG_FILE:
                    notes.append(f"resume: {k} {saved[k]!r} -> {v!r} (given now)")
            check_resume_early(ckpt, meta, given, {**saved, **given}.get("task") or RunOptions.task)
    out = {**saved, **given}
    # one length (or validation interval) in two units: the one given with the higher priority wins, so
    # `--config seed002_mmseg.toml --max_steps 4` shortens the file's runner.max_iters (max_batches) run
    layers = [("the command line", explicit), (f"--config {explicit.get('config')}", file_vals), ("the run", saved)]
    for what, pair in (
        ("run's length", ("max_steps", "max_batches")),
        ("validation interval", ("val_check_steps", "val_check_batches")),
    ):
        if all(out.get(k) is not None for k in pair):
            rank = {k: next(i for i, (_, d) in enumerate(layers) if d.get(k) is not None) for k in pair}
            if rank[pair[0]] != rank[pair[1]]:
                win, lose = sorted(pair, key=rank.__getitem__)
                notes.append(
                    f"{win}={out[win]} from {layers[rank[win]][0]} replaces {lose}={out[lose]} from "
                    f"{layers[rank[lose]][0]} (both set the {what}, in optimizer steps or in batches)"
                )
                out.pop(lose)
    return out


def saved_settings(run_dir: Path, notes: list[str], ckpt_path: Path | None = None) -> dict[str, Any]:
    """A resumed run's settings: its config.toml, checked like any config file; when that file is missing, empty or
    unreadable, the copy inside checkpoints/last.pt (written with every checkpoint), so no one file is needed."""
    path = run_dir / "config.toml"
    problem = None
    try:
        flat = load_config_file(path, what="resume: the run's settings file")
        if flat:
            return check_settings(flat, all_rules(), str(path))
        problem = "is empty"
    except ConfigError:
        if path.is_file() and path.stat().st_size > 0:
            raise  # a damaged or hand-edited file that says something: its own line, never silently ignored
        problem = "is missing" if not path.exists() else "is empty"
    ckpt_path = ckpt_path or run_dir / "checkpoints" / "last.pt"
    from_ckpt = checkpoint_settings(ckpt_path)
    if from_ckpt is not None:
        refuse_untrusted(from_ckpt.get("task"), f"--resume {run_dir}: {ckpt_path} (its copy of the settings)")
        notes.append(f"resume: {path} {problem}; the run's settings are read from its checkpoint")
        return check_settings(from_ckpt, all_rules(), f"{ckpt_path} (settings)")
    requested = _json_block(run_dir / "config.json", "requested")  # a checkpoint written before settings were kept
    if requested:
        notes.append(
            f"resume: {path} {problem} and the checkpoint predates saved settings; the training settings are read "
            f"from config.json, the task's from the flags given now (their defaults otherwise)"
        )
        return check_settings({k: v for k, v in requested.items() if k in field_rules(TrainConfig)},
                              field_rules(TrainConfig), str(run_dir / "config.json"))  # fmt: skip
    notes.append(f"resume: {path} {problem} and no saved settings were found; the flags given now and defaults apply")
    return {}


def _json_block(path: Path, key: str) -> dict[str, Any]:
    import json

    try:
        block = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return {}
    return block if isinstance(block, dict) else {}


def check_resume_early(ckpt_path: Path, meta: dict[str, Any], given: dict[str, Any], task: str) -> None:
    """The engine's one resume check (trainer/state.py check_resume), before the task is built and anything is
    written: the settings given now, the task this resume builds (a task file's Task is named by its builder: the
    engine compares that one once it is built) and --max_steps against the checkpoint's step."""
    sections = meta.get("settings")
    if not isinstance(sections, dict):  # written before checkpoints carried the settings
        sections = {"train": meta.get("config") or {}}
    now = {t: {k: given[k] for k in v if k in given} for t, v in sections.items() if isinstance(v, dict)}
    try:
        check_resume(meta, ckpt_path, now, None if is_user_task(task) else task, total_steps=given.get("max_steps"))
    except SettingsChanged as e:  # in the command line's words: the flags given
        if e.changed:
            raise ConfigError(
                f"{', '.join(f'--{k} {_shown(b)}' for k, _, b in e.changed)}: the run at {ckpt_path} was made with "
                f"{', '.join(f'{k} {_shown(a)}' for k, a, _ in e.changed)}, and a resumed run keeps them (its state "
                f"was made with them); resume without {'them' if len(e.changed) > 1 else 'it'}, or start a new run "
                f"with the new values: --config {shlex.quote(str(ckpt_path.parent.parent / 'config.toml'))} plus "
                f"the flags"
            ) from None
        raise ConfigError(
            f"--max_steps {given['max_steps']}: the run at {ckpt_path} is already at step {e.step}; give at least "
            f"--max_steps {e.step} (more continues it), or leave it out to keep the run's own length"
        ) from None


def _shown(v: Any) -> str:
    return " ".join(map(str, v)) if isinstance(v, list) else "unset" if v is None else str(v)


def _checkpoint_meta(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # damaged or not a checkpoint: the resume itself says so, with its own message
        return None
    return ckpt if isinstance(ckpt, dict) else None


def checkpoint_settings(path: Path) -> dict[str, Any] | None:
    """The flat settings a checkpoint carries (key "settings": {table: {key: value}}), or None."""
    ckpt = _checkpoint_meta(path)
    sections = ckpt.get("settings") if ckpt is not None else None
    if not isinstance(sections, dict):
        return None
    flat: dict[str, Any] = {}
    for table in sections.values():
        if isinstance(table, dict):
            flat.update({k: v for k, v in table.items() if v is not None})
    return flat


def _resume_dir(resume: str, given: dict[str, Any], notes: list[str] | None = None) -> Path | None:
    out = Path(given.get("output_dir", TrainConfig.output_dir))
    if resume != "auto":
        p = Path(resume)
        if not p.exists():
            raise ResumeError(f"--resume {resume}: no such checkpoint or run directory")
        if not p.is_dir() and not p.is_file():  # reading a FIFO would wait forever for a writer
            raise ResumeError(f"--resume {resume}: not a checkpoint file or a run directory (a FIFO or a device?)")
        run_dir = p if p.is_dir() else p.parent.parent
        refuse_if_live(run_dir)  # before looking for last.pt: a live run may not have written one yet
        return run_dir
    # the engine's rule (TrainConfig(resume="auto") resolves with it too); a user task's runs are found by its spec
    task = given.get("task", RunOptions.task)
    find = (lambda root: find_resumable_user_task(root, task)) if is_user_task(task) else None
    said: list[str] = []
    found = resume_auto(out, given.get("run_name"), task, said, find)
    if is_user_task(task):  # its runs are <its name>-<time>, found by the spec their config.toml records
        said = [n.replace(f"unfinished {task}-* run", f"unfinished run of --task {task}") for n in said]
    if notes is not None:
        notes += said
    return found


def split_settings(values: dict[str, Any]) -> tuple[RunOptions, dict[str, Any], dict[str, Any]]:
    """(run options, task builder kwargs, TrainConfig kwargs) from one flat dict of settings."""
    kinds = names()
    run = RunOptions(**{k: v for k, v in values.items() if k in kinds["run"]})
    check_task_name(run.task)
    if run.preset == "seed":
        run.preset = "full"  # the earlier name; the note is printed by run()
    task_keys = kinds[run.task]
    other_tasks = {k for name, group in kinds.items() if name not in ("run", "train", run.task) for k in group}
    stray = [k for k in values if k in other_tasks and k not in task_keys and k not in kinds["train"]]
    if stray:
        raise ConfigError(
            f"--task {run.task} does not take {', '.join('--' + k for k in stray)} (other task's settings)"
        )
    task_kw = {k: v for k, v in values.items() if k in task_keys and k not in ("seed", "device_cache")}
    train_kw = {k: v for k, v in values.items() if k in kinds["train"]}
    return run, task_kw, train_kw


def while_exiting() -> None:
    """The program is done and its exit code decided: a stop signal while the interpreter exits (torch's exit-time
    clean-up) is one line and changes nothing; it said "during start-up" and turned a finished run into 128 + N."""
    for s in handled_signals():
        signal.signal(s, _note_while_exiting)


def _note_while_exiting(signum: int, frame: Any) -> None:
    os.write(2, f"[plainloop] {signal.Signals(signum).name} while exiting: ignored (the run had ended)\n".encode())


class StoppedInSetUp(BaseException):
    """A stop signal before training started: nothing to save, exit 128 + N with one line."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_TRAINED: list[bool] = []


def _setup_stop(signum: int, frame: Any) -> None:
    raise StoppedInSetUp(signum)


def untrusted_task(argv: list[str], spec: str) -> str | None:
    """Why the user task `spec` (module:function or path/file.py:function) may not be imported: a --config file or
    the resumed run's config.toml names it (a file received from someone else), not --task on this command line, and
    --trust_task is not given. None: it may. Importing a module runs its code, calling the function runs more
    (`os:system` with a `command` key is a shell command), so a file alone never runs either."""
    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--task", "--config", "--resume", "--output_dir", "--run_name"):
        pre.add_argument(flag)
    pre.add_argument("--trust_task", nargs="?", const="on")
    known, _ = pre.parse_known_args(argv)
    if known.task:
        return None  # typed by the user
    if known.trust_task is not None and known.trust_task.strip().lower() in ("1", "true", "yes", "on"):
        print(f"[plainloop] task: running {spec} as the settings name it (--trust_task)")
        return None
    toml = resume_config(known.resume, known.output_dir, known.run_name)
    where = f"--config {known.config}" if known.config else f"--resume {known.resume}: {toml or 'its config.toml'}"
    return refusal(where, spec)


def refusal(where: str, spec: str) -> str:
    """The one line that refuses a task named by a file."""
    what = "a Python file" if spec.rpartition(":")[0].endswith(".py") else "a module and function"
    return (
        f"{where} names the task {spec}, {what} that would be imported and called; a task named by a config file or "
        f"a run directory runs only when you name it too: add --task {shlex.quote(spec)} (or --trust_task, if you "
        f"trust that file)"
    )


_TRUSTED: list[str] = []  # the user task this command line may run (use_task_flags checked where it came from)


def refuse_untrusted(task: object, where: str) -> None:
    """A user task in settings use_task_flags did not read (the checkpoint's copy of them) is refused, unread."""
    if isinstance(task, str) and is_user_task(task) and task not in _TRUSTED:
        raise ConfigError(refusal(where, task))


def use_task_flags(argv: list[str]) -> None:
    """A user task (--task module:function, or the one a --config file or the resumed run names, with --trust_task)
    joins TASK_BUILDERS, so its parameters are flags and config-file keys like the built-in tasks'."""
    spec = spec_from_argv(argv)
    set_task_flag(None)
    _TRUSTED.clear()
    if spec is not None:
        if why := untrusted_task(argv, spec):
            raise ConfigError(why)
        _TRUSTED.append(spec)
        set_task_flag(spec)  # the resume line a stop prints names it: the resume needs it again
    if spec is not None and spec not in TASK_BUILDERS:
        try:
            register_user_task(spec, {f.name: "the command-line flag" for f in dataclasses.fields(RunOptions)})
        except KNOWN_ERRORS as e:
            if any(a == "--task" or a.startswith("--task=") for a in argv):
                raise
            # the spec came from a --config file or the resumed run: a relative module or file is read from here
            raise ConfigError(
                f"{e} (task = {spec!r} comes from the --config file or the resumed run's config.toml; run from the "
                f"folder it was started in, or give --task with the full path, e.g. --task /path/to/file.py:function)"
            ) from None


class _Unbreakable:
    """stdout/stderr whose reader went away (`| head` exits): its writes are dropped and the run goes on (exit 0);
    the run's files hold everything it printed."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.broken = stream, False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._quiet()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._quiet()

    def _quiet(self) -> None:
        self.broken = True
        try:  # what is still buffered goes nowhere, also at interpreter exit (else "Exception ignored ...")
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, _Unbreakable) else _Unbreakable(s) for s in streams)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = streams


def exit_code(e: BaseException) -> int:
    """4 for a failure of the storage (a full disk, no permission, a vanished run directory), else 2 (bad input)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, StorageError) or (isinstance(seen, OSError) and seen.errno in STORAGE_ERRNOS):
            return 4
        seen = seen.__cause__
    return 2


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        use_task_flags(argv)
    except KNOWN_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    explicit = vars(parser.parse_args(argv))
    debug = explicit.get("debug") or os.environ.get("PLAINLOOP_DEBUG", "") not in ("", "0")
    old = {}
    _TRAINED.clear()
    try:
        if threading_main():
            # until the trainer installs its own handlers (which save last.pt), a signal ends set-up cleanly
            old = {s: signal.signal(s, _setup_stop) for s in handled_signals()}
        with cli_session():  # the engine's messages name this script's flags (not the Python call)
            return run(explicit)
    except StoppedInSetUp as e:
        name = signal.Signals(e.signum).name
        what = (
            "after the run finished: it is complete, nothing to resume"  # exit 0: 128+N says a run is not done
            if _TRAINED
            else "during set-up: stopped before training started; nothing to resume"
        )
        print(f"[plainloop] {name} {what}", file=sys.stderr)
        return 0 if _TRAINED else 128 + e.signum
    except KeyboardInterrupt as e:  # a second Ctrl-C: the first one's orderly stop was cut short on purpose
        saved = e.saved if isinstance(e, SecondInterrupt) else "what was saved is in the run's checkpoints/ folder"
        print(f"[plainloop] SIGINT again: stopped at once, nothing more written; {saved}", file=sys.stderr)
        return 128 + signal.SIGINT
    except KNOWN_ERRORS as e:
        if debug:
            raise
        text = str(e).strip() or type(e).__name__
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError | StorageError) and e.filename:
            text = f"{e.filename}: {e.strerror or e}"
        print(f"error: {' '.join(text.splitlines()) if len(text.splitlines()) > 2 else text}", file=sys.stderr)
        print("(run with --debug or PLAINLOOP_DEBUG=1 for the traceback)", file=sys.stderr)
        return exit_code(e)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class SecondInterrupt(KeyboardInterrupt):
    """A second Ctrl-C during training; `saved` says what the run left to continue from."""

    def __init__(self, saved: str) -> None:
        super().__init__(saved)
        self.saved = saved


def left_to_resume(run_dir: Path | None, task: str) -> str:
    """What a run stopped at once (a second Ctrl-C) left to continue from: its last.pt, else nothing to resume."""
    if run_dir is None:
        return "no run directory was made, so there is nothing to resume; run the same command again"
    last, best, toml = run_dir / "checkpoints" / "last.pt", run_dir / "checkpoints" / "best.pt", run_dir / "config.toml"
    if last.is_file():
        return f"{last} is the last checkpoint saved; resume with: {resume_hint(run_dir, launch_prefix())}"
    again = rerun_command(toml, task=task) if toml.is_file() else "the same command"
    kept = f"; {best} holds the best weights so far (--resume {shlex.quote(str(best))} continues from it)"
    return (
        f"no checkpoint was saved yet ({last} does not exist), so there is nothing to resume: start again with "
        f"{again}{kept if best.is_file() else ''}"
    )


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run(explicit: dict[str, Any]) -> int:
    notes: list[str] = []
    opts, task_kw, train_kw = prepare(explicit, notes)
    return train(opts, task_kw, train_kw, notes)


def prepare(explicit: dict[str, Any], notes: list[str]) -> tuple[RunOptions, dict[str, Any], dict[str, Any]]:
    """Every check of the settings, before anything is written: (run options, task kwargs, TrainConfig kwargs)."""
    values = resolve_settings(explicit, notes)
    refuse_untrusted(values.get("task"), f"--resume {explicit.get('resume')}: the run's saved settings")
    values = check_settings(values, all_rules(), "settings", notes, style="flag")  # the merged layers, once more
    if values.get("preset") == "seed":
        notes.append("--preset seed is now called --preset full (the same model); read as full")
    opts, task_kw, train_kw = split_settings(values)
    TrainConfig.from_dict({k: v for k, v in train_kw.items()}, where="settings")  # cross-field rules, before writing
    check_output_dirs(
        [
            ("--output_dir", train_kw.get("output_dir", TrainConfig.output_dir)),
            ("--cache_dir", task_kw.get("cache_dir")),
        ]
    )
    parse_logger_names(opts.logger)  # a bad --logger is said before any work
    on_gpu = _on_gpu(train_kw)
    task_kw, preset_note = resolve_task_args(opts.task, task_kw, opts.preset, on_gpu, train_kw.get("batch_size"))
    if preset_note:
        notes.append(preset_note)
    task_kw.update(seed=train_kw.get("seed", TrainConfig.seed), device_cache=train_kw.get("device_cache"))
    return opts, task_kw, train_kw


def _on_gpu(train_kw: dict[str, Any]) -> bool:
    return torch.cuda.is_available() and str(train_kw.get("device") or "cuda").startswith("cuda")


def train(opts: RunOptions, task_kw: dict[str, Any], train_kw: dict[str, Any], notes: list[str]) -> int:
    """Build the task and train it (or run a measurement tool), with settings `prepare` checked."""
    on_gpu = _on_gpu(train_kw)
    say = print if int(os.environ.get("RANK", "0")) == 0 else (lambda *a, **k: None)  # under torchrun: rank 0 speaks
    for n in notes:
        say(f"[plainloop] {n}")
    if is_user_task(opts.task):  # its builder takes the run's TrainConfig: the settings first, then the task
        cfg = TrainConfig(**{"run_name": None, **train_defaults(opts.task, on_gpu, task_kw, 0), **train_kw})
        task = build_task(opts.task, cfg, **task_kw)
    else:
        task = TASK_BUILDERS[opts.task]()(**task_kw)
    for line in data_lines(task):
        say(f"[plainloop] {line}")
    if not is_user_task(opts.task):
        defaults = train_defaults(opts.task, on_gpu, task_kw, len(cast(Sized, task.train_set)))  # map-style
        cfg = TrainConfig(**{"run_name": None, **defaults, **train_kw})
    if opts.auto_batch_size or opts.auto_num_workers:
        from tasks.cli_tools import autotune

        cfg = autotune(cfg, task, opts)
    if opts.system_report:
        from tasks.cli_tools import system_report

        return system_report(cfg, opts, task_kw)
    sections = {
        "run": {k: v for k, v in dataclasses.asdict(opts).items() if k not in NOT_IN_CONFIG_FILE},
        # every task setting, its defaults included: a resume compares them (trainer/state.py resume_changes)
        "task": {k: v for k, v in {**task_defaults(opts.task), **task_kw}.items() if k not in ("seed", "device_cache")},
    }
    if opts.profile:
        from tasks.cli_tools import profile

        profile(cfg, task, sections)
        if not opts.profile_then_train:
            say("[plainloop] profiled only, nothing trained (add --profile_then_train to go on and train)")
            return 0
    from trainer.loop import Trainer

    callbacks, monitor = plugins(opts, cfg)
    callbacks.append(ReportLines(opts, task.console_metrics))  # the scores and plots, before the engine's last lines
    trainer: Trainer | None = None
    try:
        trainer = Trainer(cfg, task, callbacks=callbacks, monitor=monitor, config_sections=sections)
        lines = task.info.get("sampler") or []
        for line in [lines] if isinstance(lines, str) else lines if isinstance(lines, list) else []:
            say(f"[plainloop] sampler: {line}")  # the P x K sampler's cache summary, once (rank 0)
        trainer.fit()  # its last lines: the scores and plots (ReportLines), then done ... and the run directory
        _TRAINED.append(True)  # a signal after the closing lines no longer says "set-up"
    except RunFinished as e:  # nothing to do is not an error: one line, exit 0, no file touched
        say(f"[plainloop] {e}")
        return 0
    except KeyboardInterrupt:  # a second Ctrl-C: main says what the run left
        run_dir = trainer.run_dir if trainer is not None else None
        raise SecondInterrupt(left_to_resume(run_dir, opts.task)) from None
    except ResumeError as e:
        changed = [n for n in notes if n.startswith("resume:")]
        raise ResumeError(
            f"{e}{' (settings changed from the saved run: ' + '; '.join(c[8:] for c in changed) + ')' if changed else ''}"
        ) from None
    return 0


def task_defaults(name: str) -> dict[str, Any]:
    """The task builder's keyword defaults that are plain values (what config.toml can hold), None included: a
    resume compares every saved one, an unset one too (trainer/state.py resume_changes)."""
    plain = (bool, int, float, str, list, tuple, type(None))
    try:
        params = function_parameters(TASK_BUILDERS[name]())
    except (KeyError, TypeError, ValueError):
        return {}
    return {k: d for k, (_, d) in params.items() if isinstance(d, plain)}


def data_lines(task: Any) -> list[str]:
    """Say where the data came from: the built-in synthetic sample, or the files read."""
    data = task.info.get("data")
    if isinstance(data, dict) and "source_files" in data:
        files = data["source_files"]
        what = (
            "the built-in SYNTHETIC sample (ERA5 format, not real data)"
            if data.get("builtin_sample")
            else f"{len(files)} file(s): {files[0]}{' ...' if len(files) > 1 else ''}"
        )
        return [f"data: {what}; months {data.get('months', '?')}, grid {data.get('grid', '?')}"]
    if task.info.get("data_source"):
        return [f"data: {task.info['data_source']}"]
    return []


def plugins(opts: RunOptions, cfg: TrainConfig) -> tuple[list[Any], Any]:
    """The monitor, the verdict and the loggers, handed to the engine from outside."""
    from utils.callbacks import VerdictCallback
    from utils.performance_monitor import TrainingMonitor

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = cfg.device or (f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    monitor = TrainingMonitor(interval=opts.monitor_interval, batch_size=cfg.batch_size, device=torch.device(device))
    callbacks: list[Any] = [VerdictCallback()]
    for name in parse_logger_names(opts.logger):  # the loggers: each gets config.json and every metrics.jsonl row
        try:
            if name == "tensorboard":
                from utils.tensorboard_logger import TensorBoardLogger

                callbacks.append(TensorBoardLogger())
            elif name == "wandb":
                callbacks.append(WandbLogger())
            else:
                callbacks.append(CSVLogger())
        except ImportError as e:
            raise ConfigError(f"--logger {name}: {e}" if name == "tensorboard" else str(e)) from None
    return callbacks, monitor


class ReportLines:
    """At the end of a run (rank 0), before the engine's closing lines (done ..., run directory ...): report_run."""

    def __init__(self, opts: RunOptions, shown: tuple[str, ...] | None) -> None:
        self.opts, self.shown = opts, shown

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        if trainer.is_main and trainer.run_dir is not None:
            report_run(summary, trainer.run_dir, self.opts, self.shown)


def report_run(summary: dict[str, Any], run_dir: Path, opts: RunOptions, shown: tuple[str, ...] | None = None) -> None:
    """The final scores (of the metrics, those in `shown`: the task's console_metrics; None: all) and the plots; the
    re-run command goes into the summary, for the run directory line the engine prints last (trainer/finish.py)."""
    from utils.tools import write_plots

    if "test_scores" in summary:
        from utils.metrics import format_scores

        print("[plainloop] test split, latitude-weighted over ocean cells:")
        print(format_scores(summary["test_scores"]))
    elif summary["final_metrics"]:
        final = summary["final_metrics"]
        for k, v in final.items():
            if shown is None or k in shown:  # e.g. not re-ID's "<...>_trials" (a count of gallery draws)
                print(f"  {k}: {v:.4f}")
        hidden = len(final) - sum(1 for k in final if k in shown) if shown is not None else 0
        if hidden:
            print(f"  (+{hidden} more in summary.json)")
    if opts.plots:
        write_plots(run_dir)
    summary["rerun"] = rerun_command(run_dir / "config.toml", task=opts.task)


def rerun_command(config: Path, env: Any = os.environ, task: str | None = None) -> str:
    """The command that runs this job again: under torchrun (WORLD_SIZE > 1) with its torchrun prefix; the path is
    shell-quoted, so a directory with a space or a `$(...)` in its name pastes as itself. A user task is named with
    --task: a config file's task is not run unless the command line names it too."""
    launch = launch_prefix(env)
    cmd = f"{cli_command(launch)} --config {shlex.quote(str(config))}"
    if task and is_user_task(task):
        cmd += f" --task {shlex.quote(task)}"
    return cmd + (" (on each node)" if "--nnodes" in launch else "")


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        while_exiting()  # a signal during interpreter exit no longer changes the exit code
