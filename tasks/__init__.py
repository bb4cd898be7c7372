"""The tasks the CLI trains: ERA5 SST forecasting (the main job), cross-modality re-ID, and the user's own.

Each builder returns a `trainer.Task`; the engine in `trainer/` knows nothing about either task. The CLI makes
one `--flag` per builder parameter (help text from the module's ARGS_HELP, or the builder's docstring).

A task of your own: `--task package.module:function` (or `--task path/to/file.py:function`) names a builder

    def build(cfg: TrainConfig, *, hidden: int = 64, data_dir: str = "data") -> Task:
        '''My regression task.

        Args:
            hidden: width of the hidden layer
            data_dir: folder of the CSV files
        '''

Its keyword parameters become flags (--hidden, --data_dir) and config-file keys; the annotation gives the type
(int, float, str, bool, pathlib.Path, a Literal, tuple[...] / list[...] of these, or X | None), the default the
default (none = a required flag), the docstring's "Args:" lines the help. An optional first parameter named `cfg`
receives the run's TrainConfig (seed, batch size, device ...); Python, NumPy and torch are seeded with cfg.seed
before the builder runs, and a builder file's folder is importable (its `import cnn` finds cnn.py beside it). A
module-level dict TRAIN_DEFAULTS = {"epochs": 5} sets training defaults the command line and config files override.
The run's config.toml records the builder and its arguments, so --resume RUN_DIR --task SPEC and --resume auto rebuild
the same task. A task that only a file names (a --config file, a run's config.toml) is never imported: the command
line names it (--task) or trusts it (--trust_task; train_optimized.py checks where the spec came from).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from trainer import Task, TrainConfig
from trainer.runtime import seed_everything

# submodules of this package, by relative name: installed, the package is plainloop._app.tasks, not `tasks`
MODULES = {"era5": (".era5", "build_era5_task"), "reid": (".reid", "build_reid_task")}
# settings of the [run] and [task] tables a resumed run keeps (the model, the data and its split, the loss); the
# others are trainer/state.py's TABLE_MAY_CHANGE. A user task's own settings are fixed unless named there.
RESUME_FIXED_SETTINGS = frozenset(
    {
        "task", "preset", "seed", "learning_rate",
        # era5
        "variable", "resolution", "lon", "lat", "split_ratio", "offset", "seq_len", "calendar", "prior",
        "lim_variance", "lim_max_modes", "ensemble", "patch_size", "d_model", "num_heads", "num_layers",
        "dim_feedforward", "recursion_depth", "dropout",
        # reid
        "reid_format", "num_identities", "num_instances", "num_passes", "epoch_length", "image_size", "width",
        "channel_aug", "margin", "ce_weight", "label_smoothing", "val_fraction", "sysu_trials",
    }
)  # fmt: skip
CLI_DATA_PATH_HOW = "give --data_path a netCDF file, a directory of them or a glob, or set $ERA5_DATA_PATH"
ERA5_MODEL_KEYS = (
    "resolution",
    "d_model",
    "num_heads",
    "num_layers",
    "dim_feedforward",
    "recursion_depth",
    "dropout",
    "seq_len",
)


def task_module(name: str) -> ModuleType:
    """The module of a built-in task; for a registered user task, a stand-in with its ARGS_HELP (the docstring's
    lines) and TRAIN_DEFAULTS."""
    if name in USER_MODULES:
        return USER_MODULES[name]
    if name not in MODULES:
        raise ValueError(
            f"unknown task {name!r}; use one of {', '.join(MODULES)} or your own builder as package.module:function"
        )
    return importlib.import_module(MODULES[name][0], __name__)


def _builder(name: str) -> Callable[[], Callable[..., Task]]:
    return lambda: getattr(task_module(name), MODULES[name][1])


TASK_BUILDERS: dict[str, Callable[[], Callable[..., Task]]] = {name: _builder(name) for name in MODULES}
USER_MODULES: dict[str, ModuleType] = {}  # user tasks registered in this process (register_user_task)


def build_task(name: str, cfg: TrainConfig | None = None, /, **kwargs: Any) -> Task:
    """A built-in task by name (its builder's keywords, `name` and `cfg` among them), or a user task by
    `module:function` (also given `cfg`)."""
    if is_user_task(name):
        return build_user_task(name, cfg or TrainConfig(), kwargs)
    check_task_name(name)
    return TASK_BUILDERS[name]()(**kwargs)


def check_task_name(name: str) -> None:
    """A built-in name or a module:function spec; anything else is a TaskSpecError naming both forms."""
    if name not in MODULES and not is_user_task(name):
        raise TaskSpecError(
            f"--task {name}: unknown task; use {', '.join(MODULES)} or your own builder as package.module:function "
            f"(or path/to/file.py:function)"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def resolve_task_args(
    task: str, kw: dict[str, Any], preset: str, on_gpu: bool, batch_size: int | None = None
) -> tuple[dict[str, Any], str]:
    """ERA5: fill the model and grid from the preset (explicit settings win); returns (kwargs, note).
    Re-ID: check the P x K batch against the flags (`batch_size`: the one given, None = the task's default)."""
    if task == "reid":
        _check_pk_batch(kw, batch_size)
    if task != "era5":
        return kw, ""
    # the library's errors name its keywords (lat=, data_path=); checked here first, they name the flags
    from datasets.area import LAT_LIMITS, LON_LIMITS

    lon, lat = kw.get("lon"), kw.get("lat")
    for flag, values, (lo, hi), what in (("lon", lon, LON_LIMITS, "W E"), ("lat", lat, LAT_LIMITS, "S N")):
        if values is not None and not all(lo <= v <= hi for v in values):  # NaN fails too
            raise ValueError(
                f"--{flag} {' '.join(f'{v:g}' for v in values)}: {what} must each lie in [{lo:g}, {hi:g}] degrees"
                + (" (either convention: -180..180 or 0..360)" if flag == "lon" else "")
            )
    if (lon is not None and lon[0] == lon[1]) or (lat is not None and lat[0] >= lat[1]):
        raise ValueError(
            f"--lon {' '.join(map(str, lon or ()))} / --lat {' '.join(map(str, lat or ()))}: give "
            f"W != E and S < N (W > E crosses the dateline, e.g. --lon 170 -120)"
        )
    if kw.get("data_path") is not None:  # $ERA5_DATA_PATH is checked by the dataset, naming the variable
        from datasets.era5_files import resolve_files

        resolve_files(kw["data_path"], name="--data_path", how=CLI_DATA_PATH_HOW)
    ratio = kw.get("split_ratio")
    if ratio is not None and (sum(ratio) > 1 + 1e-6 or any(r < 0 for r in ratio)):
        raise ValueError(f"--split_ratio {' '.join(map(str, ratio))}: fractions must be >= 0 and sum to at most 1")
    mod = task_module("era5")
    name = {"auto": "full" if on_gpu else "cpu", "seed": "full"}.get(preset, preset)  # seed: full's earlier name
    values = mod.SEED_PRESET if name == "full" else mod.CPU_PRESET
    kw = {**values, **{k: v for k, v in kw.items() if v is not None}}
    layers, depth = kw["num_layers"], kw["recursion_depth"]
    note = (
        f"preset: {name} ({'the full-size model' if name == 'full' else 'reduced for a CPU'}: "
        f"{kw['resolution']:g} deg, d_model {kw['d_model']}, {_count(layers, 'layer')} x "
        f"{_count(depth, 'recursion')}); explicit settings override it"
    )
    return kw, note


def _check_pk_batch(kw: dict[str, Any], batch_size: int | None) -> None:
    """The sampler's own error names its keywords (batch_size=, num_instances=); checked here first, before the
    data is read, it names the flags."""
    import inspect

    k = kw.get("num_instances")
    if k is None:
        k = inspect.signature(_builder("reid")()).parameters["num_instances"].default
    if batch_size is None or isinstance(batch_size, bool) or not isinstance(k, int) or k < 1:
        return  # the task's default batch is P x K; a bad --num_instances is the builder's error
    if batch_size % k:
        lo = batch_size - batch_size % k
        raise ValueError(
            f"--batch_size {batch_size} is not divisible by --num_instances {k}: a P x K batch needs --batch_size = "
            f"P x --num_instances (P identities, K images each), e.g. --batch_size {lo or k} or {lo + k}"
        )


def train_defaults(task: str, on_gpu: bool, kw: dict[str, Any], n_train: int) -> dict[str, Any]:
    """TrainConfig values the task recommends for settings the user did not give."""
    if is_user_task(task):
        return user_train_defaults(task)
    if task == "reid":  # test with the weights val chose
        # a P x K batch: batch_size must be a multiple of K (the engine's 150 is not, for K = 4). The synthetic set
        # on a CPU: P = 8 (32 steps of 8 x 4 per epoch, 60 epochs); image folders and GPUs: P = 16 (64 at K = 4)
        k = int(kw.get("num_instances") or 4)
        small = kw.get("data_path") is None and not on_gpu
        # every 20 epochs, as the re-ID figures in docs/tasks were measured (a 60-epoch CPU run validates 3 times)
        return {
            "batch_size": (8 if small else 16) * k,
            **({"epochs": 60} if small else {}),
            "test_with_best": True,
            "validation_interval": 20,
        }
    out = task_module("era5").era5_train_defaults(on_gpu, kw.get("data_path") is None, n_train)
    if not on_gpu and kw.get("d_model", 512) <= 128:
        # a model this small gains nothing from a second thread, and threads that spin on shared cores lose a lot
        # (the CPU demo's first 40 steps: 8-22 s with 1 thread, 21-44 s with 2, on this 2-core machine under load)
        out["num_threads"] = 1
    return out


# ------------------------------------------------------------------------------------------- the user's own task
class TaskSpecError(ValueError):
    """A --task module:function that cannot be imported, introspected or called; the message says how to fix it."""


HOW = "give --task package.module:function or --task path/to/file.py:function, a builder returning a trainer.Task"
_SIMPLE = (int, float, str, bool, Path)


def is_user_task(spec: str | None) -> bool:
    return isinstance(spec, str) and ":" in spec


def task_label(spec: str) -> str:
    """A name fit for a directory: the built-in name, or the spec with ':' and '/' replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", spec).strip("-.") or "task"


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """One keyword parameter of a builder, as a flag: --name of type `annotation` (default: `default`)."""

    name: str
    annotation: Any
    default: Any  # inspect.Parameter.empty: a required flag
    help: str

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


def load_builder(spec: str) -> Callable[..., Any]:
    """Import the builder named by `module:function` (the current directory is importable, as with `python -m`)."""
    mod_name, _, fn_name = spec.rpartition(":")
    if not mod_name or not fn_name.isidentifier():
        raise TaskSpecError(f"--task {spec}: not a module:function pair; {HOW}")
    caller = os.environ.get("PLAINLOOP_CALLER_DIR")  # the launcher runs from the repository; the user was here
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if not path.is_file() and caller and not path.is_absolute() and (Path(caller) / path).is_file():
            path = Path(caller) / path
        if not path.is_file():
            raise TaskSpecError(f"--task {spec}: no such file {path}; {HOW}")
        name = f"plainloop_task_{task_label(str(path.resolve())).replace('.', '_').replace('-', '_')}"
        module = sys.modules.get(name)
        folder = str(path.resolve().parent)
        if folder not in sys.path:  # its `import cnn` finds cnn.py beside it, as `python file.py` would
            sys.path.append(folder)  # appended: a file named like one of plainloop's modules does not shadow it
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module  # dataclasses and pickling (loader workers) look the module up here
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                sys.modules.pop(name, None)
                raise TaskSpecError(f"--task {spec}: running {path} failed: {type(e).__name__}: {e}") from e
    else:
        for place in (os.getcwd(), caller):  # `python train_optimized.py` puts the script's folder first, not these
            if place and place not in sys.path:
                sys.path.append(place)
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
                raise TaskSpecError(
                    f"--task {spec}: no module named {e.name!r}; run from the folder that holds it, add that folder "
                    f"to PYTHONPATH, or give the file: --task path/to/{mod_name.split('.')[-1]}.py:{fn_name}"
                ) from e
            raise TaskSpecError(f"--task {spec}: importing {mod_name} failed: {e}") from e
        except Exception as e:
            raise TaskSpecError(f"--task {spec}: importing {mod_name} failed: {type(e).__name__}: {e}") from e
    fn = getattr(module, fn_name, None)
    if fn is None:
        found = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise TaskSpecError(
            f"--task {spec}: {mod_name} has no {fn_name!r}"
            + (f"; its functions: {', '.join(found[:8])}" if found else "")
        )
    if not callable(fn):
        raise TaskSpecError(f"--task {spec}: {fn_name} is a {type(fn).__name__}, not a function; {HOW}")
    return fn


def _takes_cfg(fn: Callable[..., Any]) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    return bool(params) and params[0].name == "cfg" and params[0].kind != inspect.Parameter.KEYWORD_ONLY


def docstring_args(fn: Callable[..., Any]) -> dict[str, str]:
    """Help lines of the parameters from the docstring: Google style ("Args:" then "name: text", continued on
    deeper-indented lines; "name (int): text" too) or Sphinx style (":param name: text")."""
    doc = inspect.getdoc(fn) or ""
    out: dict[str, str] = {}
    for m in re.finditer(r":param\s+(\w+):\s*(.+)", doc):
        out[m.group(1)] = m.group(2).strip()
    section = re.search(r"^(?:Args|Arguments|Parameters|Keyword Args):\s*\n((?:[ \t]+.*\n?|\s*\n)*)", doc, re.M)
    if section:
        current, indent = None, None
        for line in section.group(1).splitlines():
            if not line.strip():
                continue
            ind = len(line) - len(line.lstrip())
            arg = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if arg and (indent is None or ind <= indent):
                indent, current = ind, arg.group(1)
                out[current] = arg.group(2).strip()
            elif current is not None:
                out[current] = f"{out[current]} {line.strip()}".strip()
    return out


def _supported(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp in _SIMPLE:
        return True
    if origin is typing.Literal:
        return all(isinstance(a, int | float | str) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(rest) == 1 and _supported(rest[0])
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return bool(args) and all(a in (int, float, str, Path) for a in args) and len(set(args)) == 1
    return False


def builder_flags(spec: str, fn: Callable[..., Any] | None = None) -> list[FlagSpec]:
    """The builder's keyword parameters as flags (the leading `cfg` is not one); a parameter that cannot be a flag
    is a TaskSpecError naming it."""
    fn = fn or load_builder(spec)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # an annotation naming something not importable at run time
        raise TaskSpecError(f"--task {spec}: its annotations cannot be read: {e}") from e
    helps = {**docstring_args(fn), **getattr(inspect.getmodule(fn), "ARGS_HELP", {})}
    flags = []
    for i, (name, p) in enumerate(inspect.signature(fn).parameters.items()):
        if i == 0 and _takes_cfg(fn):
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind == p.POSITIONAL_ONLY:
            raise TaskSpecError(
                f"--task {spec}: parameter {name!r} is positional-only; make it a keyword parameter (after `*`)"
            )
        tp = hints.get(name)
        if tp is None:  # no annotation: the default's type, else text
            tp = type(p.default) if p.default not in (None, inspect.Parameter.empty) else str
        if not _supported(tp):
            raise TaskSpecError(
                f"--task {spec}: parameter {name!r} is annotated {tp!r}, which a flag cannot carry; use int, float, "
                f"str, bool, pathlib.Path, a Literal, tuple[int, ...] / list[str] style sequences, or X | None"
            )
        flags.append(FlagSpec(name, tp, p.default, helps.get(name, "")))
    return flags


def check_flag_names(spec: str, flags: list[FlagSpec], taken: dict[str, str]) -> None:
    """A builder parameter may not reuse a flag of the command line (`taken`: flag name -> what it is)."""
    for f in flags:
        if f.name in taken:
            raise TaskSpecError(
                f"--task {spec}: its parameter {f.name!r} has the name of {taken[f.name]} --{f.name}; rename the "
                f"parameter"
                + (
                    " (the builder reads the training setting as cfg." + f.name + ")"
                    if "train" in taken[f.name]
                    else ""
                )
            )


def typed_signature(spec: str, flags: list[FlagSpec]) -> Callable[..., Any]:
    """A stand-in with the flags' resolved types as its signature (what trainer/cli/options.py reads for flags)."""

    def builder(**kw: Any) -> Any:  # never called
        raise NotImplementedError(spec)

    params = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.annotation)
        for f in flags
    ]
    builder.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    builder.__annotations__ = {f.name: f.annotation for f in flags}
    return builder


def user_train_defaults(spec: str) -> dict[str, Any]:
    """The builder module's TRAIN_DEFAULTS (TrainConfig values it recommends), checked against TrainConfig."""
    module = inspect.getmodule(load_builder(spec))
    d = getattr(module, "TRAIN_DEFAULTS", None) or {}
    if not isinstance(d, dict):
        raise TaskSpecError(f"--task {spec}: TRAIN_DEFAULTS must be a dict of TrainConfig settings")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    bad = [k for k in d if k not in fields]
    if bad:
        raise TaskSpecError(f"--task {spec}: TRAIN_DEFAULTS has unknown setting(s) {bad}; use TrainConfig's fields")
    return dict(d)


def build_user_task(spec: str, cfg: TrainConfig, kwargs: dict[str, Any]) -> Task:
    """Call the builder with the run's TrainConfig (when it takes `cfg`) and its keyword arguments."""
    fn = load_builder(spec)
    flags = {f.name: f for f in builder_flags(spec, fn)}
    missing = [n for n, f in flags.items() if f.required and kwargs.get(n) is None]
    if missing:
        raise TaskSpecError(
            f"--task {spec} needs {', '.join('--' + n for n in missing)} (parameter(s) of {fn.__name__} without a "
            f"default): give them as flags or config-file keys"
        )
    kw = {k: _convert(flags[k].annotation, v) for k, v in kwargs.items() if k in flags}
    seed_everything(cfg.seed)  # --seed: the builder's weights and data draws repeat, as the built-in tasks' do
    task = fn(cfg, **kw) if _takes_cfg(fn) else fn(**kw)
    return as_engine_task(spec, fn.__name__, task)


def as_engine_task(spec: str, fn_name: str, task: Any) -> Task:
    """The builder's result as this engine's Task. A Task from another import of the engine (`from plainloop import
    Task` where plainloop and trainer are two module objects, or a copy of the engine under another package name) is
    rebuilt from its field values, the same model and dataset objects; anything else is a TaskSpecError."""
    if isinstance(task, Task):
        return task
    cls = type(task)
    names = tuple(f.name for f in dataclasses.fields(Task))
    if (
        cls.__name__ == "Task"
        and dataclasses.is_dataclass(task)
        and tuple(f.name for f in dataclasses.fields(task)) == names
    ):
        return Task(**{name: getattr(task, name) for name in names})
    what = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    raise TaskSpecError(
        f"--task {spec}: {fn_name} returned {what}, not a Task; return "
        f"Task(name, model, train_set, val_set, ...) with Task from plainloop (or trainer)"
    )


def _convert(tp: Any, v: Any) -> Any:
    """Values arrive as parsed flags (str for a Path, tuples for lists): give the builder its declared types."""
    if v is None:
        return None
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin = typing.get_origin(tp)
    if tp is Path:
        return Path(v)
    if origin in (tuple, list):
        elem = typing.get_args(tp)[0]
        items = [Path(x) if elem is Path else x for x in v]
        return list(items) if origin is list else tuple(items)
    return v


def spec_from_argv(argv: list[str]) -> str | None:
    """The user task the command line asks for, before the full parse (its flags depend on it): --task, else the
    --config file's `task`, else the run --resume names (its config.toml); None for a built-in task."""
    import argparse

    from trainer.cli.options import load_config_file

    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--task", "--config", "--resume", "--output_dir", "--run_name"):
        pre.add_argument(flag)
    known, _ = pre.parse_known_args(argv)
    if known.task:
        return known.task if is_user_task(known.task) else None
    for source in (known.config, resume_config(known.resume, known.output_dir, known.run_name)):
        if source:
            try:
                task = load_config_file(source).get("task")
            except (ValueError, OSError):
                continue  # the full parse reports a bad file with its own message
            if isinstance(task, str):
                return task if is_user_task(task) else None
    return None


def resume_config(resume: str | None, output_dir: str | None = None, run_name: str | None = None) -> Path | None:
    """The config.toml of the run --resume continues (--resume auto: the named run, when it has a checkpoint)."""
    if not resume or (resume == "auto" and not run_name):
        return None
    p = Path(output_dir or TrainConfig.output_dir) / str(run_name) if resume == "auto" else Path(resume)
    if resume == "auto" and not (p / "checkpoints" / "last.pt").is_file():
        return None  # resume auto starts a new run there: its settings are not read
    run_dir = p if p.is_dir() else p.parent.parent
    cfg = run_dir / "config.toml"
    return cfg if cfg.is_file() else None


def find_resumable_user_task(output_dir: str | Path, spec: str) -> Path | None:
    """--resume auto for a user task: the newest unfinished run under output_dir whose config.toml names `spec`
    and that no live process is training (the built-in tasks' rule, trainer/runfiles.py find_resumable)."""
    from trainer.cli.options import load_config_file
    from trainer.runfiles import finished, held_by_live_process, newest_readable

    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = []
    for p in root.iterdir():
        if not (p / "checkpoints" / "last.pt").is_file() or not (p / "config.toml").is_file():
            continue
        if finished(p) or held_by_live_process(p):
            continue
        try:
            if load_config_file(p / "config.toml").get("task") == spec:
                runs.append(p)
        except (ValueError, OSError):
            continue
    return newest_readable(runs)  # a run whose last.pt cannot be read is passed over


def register_user_task(spec: str, taken: dict[str, str] | None = None) -> list[FlagSpec]:
    """Make `spec` a task of this process's CLI, beside the built-in ones: TASK_BUILDERS[spec] gives a stand-in
    whose signature holds the builder's flags with their resolved types (what trainer/cli/options.py reads), and
    task_module(spec) its help lines. `taken`: the CLI's own flag names -> what they are (a parameter may not reuse
    one; TrainConfig's fields are always checked). Building the task is `build_user_task` (it needs the run's cfg)."""
    flags = builder_flags(spec)
    names = {f.name: "the training flag" for f in dataclasses.fields(TrainConfig)}
    check_flag_names(spec, flags, {**names, **(taken or {})})
    stand_in = typed_signature(spec, flags)
    module = types.ModuleType(f"plainloop_user_task:{spec}")
    module.ARGS_HELP = {f.name: f.help + (" (default: none; required)" if f.required else "") for f in flags}  # type: ignore[attr-defined]
    module.ARGS_RULES = {}  # type: ignore[attr-defined]
    USER_MODULES[spec] = module
    # first: a parameter named like a built-in task's (data_path) makes the one shared flag carry its type and help
    others = [(k, v) for k, v in TASK_BUILDERS.items() if k != spec]
    TASK_BUILDERS.clear()
    TASK_BUILDERS.update([(spec, lambda: stand_in), *others])
    return flags
