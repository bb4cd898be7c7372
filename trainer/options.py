"""Flags and config files generated from one source: dataclass fields (TrainConfig) or a function's signature.

    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, TrainConfig)            # --batch_size, --lr, ... with "(default: X)"
    add_function_arguments(parser, build_my_task, ARGS_HELP, "my task")
    explicit = vars(parser.parse_args())                    # only the flags the user typed (SUPPRESS defaults)
    values = {**load_config_file("run.toml"), **explicit}   # explicit flags win over the file

Config files: TOML (stdlib `tomllib`; `tomli` on Python 3.10), JSON, or YAML when PyYAML is installed. Keys are
the flag names, at the top level or in [train] / [task] / [run] tables; seed 002's mmseg/mmcv names are accepted
as aliases, each with a one-line note.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A bad config file, key or value: the message names it and what to do."""


# ------------------------------------------------------------------------------------------- value parsing
TRUE, FALSE, AUTO = ("1", "true", "yes", "on"), ("0", "false", "no", "off"), ("auto", "none")


def parse_bool(s: str) -> bool:
    v = str(s).strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{s!r} is not a boolean; use true/false (also 1/0, yes/no, on/off)")


def parse_auto_bool(s: str) -> bool | None:
    if str(s).strip().lower() in AUTO:
        return None
    try:
        return parse_bool(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{s!r}: use auto, on or off") from None


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), True
    return tp, False


def _spec(tp: Any) -> dict[str, Any]:
    """argparse keywords for a type annotation."""
    base, optional = _unwrap(tp)
    if base is bool:
        if optional:
            return {"type": parse_auto_bool, "metavar": "{auto,on,off}"}
        return {"action": argparse.BooleanOptionalAction}
    origin = typing.get_origin(base)
    if origin in (tuple, list):
        args = typing.get_args(base)
        elem = args[0] if args else str
        n = "+" if (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else len(args)
        return {"type": elem, "nargs": n}
    if typing.get_origin(base) is typing.Literal:
        return {"type": type(typing.get_args(base)[0]), "choices": typing.get_args(base)}
    return {"type": base if base in (int, float, str) else str}


def _help(text: str, default: Any) -> str:
    if default is None or default is inspect.Parameter.empty:
        return text if "default:" in text else f"{text} (default: none)"
    if isinstance(default, bool):
        default = "on" if default else "off"
    elif isinstance(default, tuple | list):
        default = " ".join(str(v) for v in default)
    return f"{text} (default: {default})".replace("%", "%%").replace("%%%%", "%%")


def _ranged(conv: Callable[[str], Any], name: str, lo: float | None, gt: float | None) -> Callable[[str], Any]:
    def parse(s: str) -> Any:
        try:
            v = conv(s)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{s!r} is not a valid {conv.__name__}") from None
        if lo is not None and not v >= lo:
            raise argparse.ArgumentTypeError(f"{s} must be >= {lo:g}")
        if gt is not None and not (v > gt and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"{s} must be > {gt:g}")
        return v

    parse.__name__ = conv.__name__
    return parse


def _add(group: Any, name: str, tp: Any, default: Any, text: str, meta: dict[str, Any], seen: set[str]) -> None:
    if name in seen:  # two tasks share a name (data_path, seed): one flag serves both
        return
    seen.add(name)
    kw = _spec(tp)
    if "choices" in meta:
        kw["choices"] = meta["choices"]
    if kw.get("type") in (int, float) and ("min" in meta or "gt" in meta):
        kw["type"] = _ranged(kw["type"], name, meta.get("min"), meta.get("gt"))
    if "metavar" in meta:
        kw["metavar"] = meta["metavar"]
    group.add_argument(f"--{name}", dest=name, default=argparse.SUPPRESS, help=_help(text, default), **kw)


def _groups(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {g.title: g for g in parser._action_groups}  # argparse keeps its groups here; read-only use


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, seen: set[str] | None = None) -> list[str]:
    """One `--flag` per field of `cls`, in the field's metadata group; returns the names added."""
    seen = set() if seen is None else seen
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        title = f.metadata.get("group", "options")
        group = _groups(parser).get(title) or parser.add_argument_group(title)
        _add(group, f.name, hints[f.name], f.default, f.metadata.get("help", ""), dict(f.metadata), seen)
        names.append(f.name)
    return names


def function_parameters(fn: Callable[..., Any]) -> dict[str, tuple[Any, Any]]:
    """{name: (annotation, default)} of a builder's keyword parameters."""
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    return {n: (hints.get(n, str), p.default) for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}  # fmt: skip


def add_function_arguments(
    parser: argparse.ArgumentParser,
    fn: Callable[..., Any],
    helps: dict[str, str],
    title: str,
    skip: Iterable[str] = (),
    seen: set[str] | None = None,
    default_text: dict[str, str] | None = None,
) -> list[str]:
    """One `--flag` per keyword parameter of `fn` (a task builder), help text from `helps`."""
    default_text = default_text or {}
    seen = set() if seen is None else seen
    group = _groups(parser).get(title) or parser.add_argument_group(title)
    names = []
    for name, (tp, default) in function_parameters(fn).items():
        if name in skip:
            continue
        _add(group, name, tp, default_text.get(name, default), helps.get(name, ""), {}, seen)
        names.append(name)
    return names


# ------------------------------------------------------------------------------------------- config files
def check_keys(d: dict[str, Any], known: Iterable[str], where: str) -> None:
    """Unknown keys are an error that names each one and the nearest valid names."""
    known = list(known)
    unknown = [k for k in d if k not in known]
    if unknown:
        hints = []
        for k in unknown:
            near = difflib.get_close_matches(k, known, n=3, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {', '.join(near)}?)" if near else ""))
        raise ConfigError(
            f"{where}: unknown setting(s) {'; '.join(hints)}. Valid settings are the TrainConfig "
            f"fields (the --flags of train_optimized.py --help)"
        )


# seed 002's mmseg/mmcv names: (table, key) -> (our key, converter)
_MMSEG: dict[tuple[str, str], tuple[str, Callable[[Any], Any]]] = {
    ("data", "samples_per_gpu"): ("batch_size", int),
    ("data", "workers_per_gpu"): ("num_workers", int),
    ("data", "pin_memory"): ("pin_memory", bool),
    ("data", "persistent_workers"): ("persistent_workers", bool),
    ("data", "prefetch_factor"): ("prefetch_factor", int),
    ("runner", "accumulative_counts"): ("accumulate_grad_batches", int),
    ("", "samples_per_gpu"): ("batch_size", int),
    ("", "workers_per_gpu"): ("num_workers", int),
    ("runner", "max_iters"): ("max_batches", int),  # mmseg iterations are batches, not optimizer steps
    ("runner", "max_epochs"): ("epochs", int),
    ("", "total_iters"): ("max_batches", int),
    ("evaluation", "interval"): ("val_check_batches", int),
    ("optimizer_config", "cumulative_iters"): ("accumulate_grad_batches", int),
    ("optimizer", "lr"): ("lr", float),
    ("optimizer", "weight_decay"): ("weight_decay", float),
    ("checkpoint_config", "interval"): ("checkpoint_every", int),
}
_IGNORED_MMSEG = {
    ("runner", "type"),
    ("optimizer", "type"),
    ("evaluation", "metric"),
    ("optimizer", "momentum"),
    ("checkpoint_config", "by_epoch"),
    ("evaluation", "pre_eval"),
    ("checkpoint_config", "max_keep_ckpts"),
    ("evaluation", "efficient_test"),
}


def _read(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8")
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                try:
                    import tomli as tomllib
                except ImportError:
                    raise ConfigError(
                        f"{path}: reading TOML needs Python 3.11+ or `pip install tomli`; or give "
                        f"the same keys as a .json file"
                    ) from None
            return tomllib.loads(text)
        if suffix == ".json":
            return json.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ConfigError(f"{path}: reading YAML needs PyYAML (`pip install pyyaml`); or use .toml") from None
            return yaml.safe_load(text) or {}
    except ConfigError:
        raise
    except Exception as e:  # the parsers' own messages carry line and column
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {e}") from None
    raise ConfigError(f"{path}: unknown config format {suffix!r}; use .toml, .json or .yaml")


def load_config_file(path: str | Path, notes: list[str] | None = None) -> dict[str, Any]:
    """Flat {flag name: value} from a config file; mmseg aliases translated (one note each into `notes`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a table of settings")
    notes = [] if notes is None else notes
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict) and key in ("train", "task", "run"):
            flat.update(value)
        elif isinstance(value, dict) and key == "fp16":  # mmcv: fp16 = dict(loss_scale=512.)
            scale = value.get("loss_scale", "dynamic")
            flat["precision"], flat["loss_scale"] = "16-mixed", str(scale)
            notes.append(f"config: mmseg fp16.loss_scale={scale} -> precision 16-mixed, loss_scale {scale}")
        elif isinstance(value, dict):
            for sub, v in value.items():
                if (key, sub) in _MMSEG:
                    ours, conv = _MMSEG[(key, sub)]
                    flat[ours] = conv(v)
                    notes.append(f"config: mmseg {key}.{sub}={v} -> {ours}={flat[ours]}")
                elif key == "optimizer_config" and sub == "grad_clip" and isinstance(v, dict) and "max_norm" in v:
                    flat["gradient_clip_val"] = float(v["max_norm"])
                    notes.append(
                        f"config: mmseg optimizer_config.grad_clip.max_norm={v['max_norm']} -> gradient_clip_val"
                    )
                elif (key, sub) not in _IGNORED_MMSEG:
                    raise ConfigError(
                        f"{path}: unknown setting {key}.{sub}; mmseg names understood: "
                        f"{', '.join(sorted(f'{t}.{k}' if t else k for t, k in _MMSEG))}"
                    )
        elif ("", key) in _MMSEG:
            ours, conv = _MMSEG[("", key)]
            flat[ours] = conv(value)
            notes.append(f"config: mmseg {key}={value} -> {ours}={flat[ours]}")
        else:
            flat[key] = value
    return flat


def coerce(values: dict[str, Any], types_: dict[str, Any], where: str) -> dict[str, Any]:
    """Check and convert file values to the fields' types (lists -> tuples); a wrong type names the key."""
    out = {}
    for k, v in values.items():
        tp, optional = _unwrap(types_[k])
        if v is None:
            if not optional:
                raise ConfigError(f"{where}: {k} cannot be empty")
            out[k] = None
            continue
        origin = typing.get_origin(tp)
        try:
            if tp is bool:
                out[k] = v if isinstance(v, bool) else parse_bool(v)
            elif origin in (tuple, list):
                if not isinstance(v, list | tuple):
                    raise TypeError
                elem = (typing.get_args(tp) or (str,))[0]
                out[k] = tuple(elem(x) for x in v)
            elif tp in (int, float):
                if isinstance(v, bool) or (tp is int and isinstance(v, float) and not v.is_integer()):
                    raise TypeError
                out[k] = tp(v)
            else:
                out[k] = str(v) if not isinstance(v, dict | list) else _bad(v)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            want = getattr(tp, "__name__", str(tp))
            raise ConfigError(f"{where}: {k}={v!r} is not a valid {want}") from None
    return out


def _bad(v: Any) -> Any:
    raise TypeError(v)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v) if math.isfinite(v) else json.dumps(str(v))
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def write_config_file(path: str | Path, sections: dict[str, dict[str, Any]], header: str = "") -> Path:
    """Write {table: {key: value}} as TOML that `load_config_file` reads back; None values are left out."""
    lines = [f"# {h}" for h in header.splitlines()] + [""] if header else []
    for table, values in sections.items():
        lines.append(f"[{table}]")
        for k, v in values.items():
            lines.append(f"{k} = {_toml_value(v)}" if v is not None else f"# {k}: unset")
        lines.append("")
    path = Path(path)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
