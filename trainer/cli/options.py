"""Flags and config files generated from one source: dataclass fields (TrainConfig) or a function's signature.

    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, TrainConfig)            # --batch_size, --lr, ... with "(default: X)"
    add_function_arguments(parser, build_my_task, ARGS_HELP, "my task")
    explicit = vars(parser.parse_args())                    # only the flags the user typed (SUPPRESS defaults)
    values = {**load_config_file("run.toml"), **explicit}   # explicit flags win over the file

Config files: TOML (stdlib `tomllib`; `tomli` on Python 3.10), JSON, or YAML when PyYAML is installed. Keys are
the flag names, at the top level or in [train] / [task] / [run] tables; mmseg/mmcv config names (data.samples_per_gpu,
runner.max_iters, ...) are accepted as aliases, each with a one-line note. Every value, typed on the command line or
read from a file, is checked by the one validator, `trainer.config.check_value`, with the rule of its field.
`--help` is short (the common flags and the list of groups); `--help GROUP` shows one group, `--help-all` every flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import typing
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from ..config import ConfigError, Rule, TypeForm, check_value, unwrap

if TYPE_CHECKING:
    import yaml

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


class ArgSpec(TypedDict, total=False):
    """argparse keywords a flag's type gives (add_argument's own names)."""

    action: type[argparse.Action]
    nargs: int | Literal["+"]
    metavar: str
    type: Callable[[str], object]  # last: the name would shadow the builtin in the annotations below it


def _spec(tp: TypeForm) -> ArgSpec:
    """argparse keywords for a type annotation (a Literal's choices are read by `_add`)."""
    base, optional = unwrap(tp)
    if base is bool:
        if optional:
            return {"type": parse_auto_bool, "metavar": "{auto,on,off}"}
        return {"action": argparse.BooleanOptionalAction}
    origin = typing.get_origin(base)
    if origin in (tuple, list):
        args = typing.get_args(base)
        elem = args[0] if args else str
        n: int | Literal["+"] = "+" if (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else len(args)
        return {"type": elem, "nargs": n}
    if typing.get_origin(base) is typing.Literal:
        return {"type": type(typing.get_args(base)[0])}
    return {"type": base if base in (int, float, str) else str}


def _help(text: str, default: object) -> str:
    if default is None or default is inspect.Parameter.empty:
        return text if "default:" in text else f"{text} (default: none)"
    if default == "":
        return f"{text} (default: empty)"
    if isinstance(default, bool):
        default = "on" if default else "off"
    elif isinstance(default, tuple | list):
        default = " ".join(str(v) for v in default)
    return f"{text} (default: {default})".replace("%", "%%").replace("%%%%", "%%")


def _checked(name: str, tp: TypeForm, rule: Rule) -> Callable[[str], object]:
    """An argparse `type` that converts and checks one value with the field's rule (the one validator); a tuple
    field's elements are checked one by one here, the whole tuple again when the settings are checked."""
    elem_rule = {k: v for k, v in rule.items() if k != "check"} if nargs_of(tp) else rule

    def parse(s: str) -> object:
        try:
            return check_value(f"--{name}", s, nargs_of(tp) or tp, elem_rule)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"--{name} ")) from None

    parse.__name__ = name
    return parse


def nargs_of(tp: TypeForm) -> TypeForm | None:
    """The element type of a tuple/list field (None for a scalar one)."""
    base, _ = unwrap(tp)
    if typing.get_origin(base) in (tuple, list):
        args = typing.get_args(base)
        return args[0] if args else str
    return None


def _add(
    group: argparse._ArgumentGroup, name: str, tp: TypeForm, default: object, text: str, meta: Rule, seen: set[str]
) -> None:
    if name in seen:  # two tasks share a name (data_path, seed): one flag serves both
        return
    seen.add(name)
    kw = _spec(tp)
    base, _ = unwrap(tp)
    choices = meta.get("choices") or (typing.get_args(base) if typing.get_origin(base) is typing.Literal else None)
    if "type" in kw:  # every value goes through the one validator, with the field's rule
        kw["type"] = _checked(name, tp, meta)
    if choices:
        kw["metavar"] = "{" + ",".join(str(c) for c in choices) + "}"
    if "metavar" in meta:
        kw["metavar"] = meta["metavar"]
    flags = [f"--{name}", *(f"--{old}" for old in meta.get("aliases", ()))]
    group.add_argument(*flags, dest=name, default=argparse.SUPPRESS, help=_help(text, default), **kw)


def _groups(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    return {g.title or "": g for g in parser._action_groups}  # argparse keeps its groups here; read-only use


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, seen: set[str] | None = None) -> list[str]:
    """One `--flag` per field of `cls`, in the field's metadata group; returns the names added."""
    seen = set() if seen is None else seen
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli") is False:
            continue
        title = f.metadata.get("group", "options")
        group = _groups(parser).get(title) or parser.add_argument_group(title)
        _add(group, f.name, hints[f.name], f.default, f.metadata.get("help", ""), dict(f.metadata), seen)
        names.append(f.name)
    return names


def function_parameters(fn: Callable[..., object]) -> dict[str, tuple[TypeForm, object]]:
    """{name: (annotation, default)} of a builder's keyword parameters."""
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    return {n: (hints.get(n, str), p.default) for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}  # fmt: skip


def add_function_arguments(
    parser: argparse.ArgumentParser,
    fn: Callable[..., object],
    helps: Mapping[str, str],
    title: str,
    skip: Iterable[str] = (),
    seen: set[str] | None = None,
    default_text: Mapping[str, str] | None = None,
    rules: Mapping[str, Rule] | None = None,
) -> list[str]:
    """One `--flag` per keyword parameter of `fn` (a task builder), help text from `helps`, rule (the knob
    keywords of trainer/config.py) from `rules`."""
    rules = rules or {}
    default_text = default_text or {}
    seen = set() if seen is None else seen
    group = _groups(parser).get(title) or parser.add_argument_group(title)
    names = []
    for name, (tp, default) in function_parameters(fn).items():
        if name in skip:
            continue
        _add(group, name, tp, default_text.get(name, default), helps.get(name, ""), dict(rules.get(name, {})), seen)
        names.append(name)
    return names


# ------------------------------------------------------------------------------------------- help
def format_help(
    parser: argparse.ArgumentParser,
    groups: Iterable[str] | None = None,
    only: Iterable[str] | None = None,
    section: str | None = None,
    footer: str | None = None,
) -> str:
    """argparse's help for some flags (dests in `only`, in one `section`) and/or some groups (titles in `groups`);
    neither: every group."""
    fmt = parser._get_formatter()
    fmt.add_usage(parser.usage, [], [])
    fmt.add_text(parser.description)
    wanted = None if groups is None else set(groups)
    picked = None if only is None else list(only)
    if picked is not None:
        by_dest = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
        fmt.start_section(section or "common flags")
        fmt.add_arguments([by_dest[d] for d in picked if d in by_dest])
        fmt.end_section()
    if picked is None or wanted is not None:
        for g in parser._action_groups:
            actions = [a for a in g._group_actions if a.dest != "help"]
            if actions and (wanted is None or g.title in wanted):
                fmt.start_section(g.title)
                fmt.add_arguments(actions)
                fmt.end_section()
    fmt.add_text(footer if footer is not None else parser.epilog)
    return fmt.format_help()


def group_titles(parser: argparse.ArgumentParser) -> list[str]:
    return [g.title for g in parser._action_groups if any(a.dest != "help" for a in g._group_actions) and g.title]


def _matches(key: str, title: str) -> bool:
    words = title.lower().replace(",", " ").split()
    return any(w.startswith(key.lower()) for w in words if w != "and")


def add_help_flags(parser: argparse.ArgumentParser, common: Iterable[str]) -> None:
    """`--help` (the `common` flags and the list of groups), `--help GROUP` (one group), `--help-all` (all)."""
    common = list(common)

    class Help(argparse.Action):
        def __call__(
            self,
            p: argparse.ArgumentParser,
            ns: argparse.Namespace,
            value: str | Sequence[str] | None,
            opt: str | None = None,
        ) -> None:
            titles = group_titles(p)
            count = sum(1 for a in p._actions if a.option_strings and a.dest != "help")
            keys = ", ".join(t.replace(",", "").split()[0] if not t.endswith(" task") else t.split()[0]
                             for t in titles)  # fmt: skip
            if opt == "--help-all" or value == "all":
                text = format_help(p)
            elif isinstance(value, str) and value:  # --help GROUP (--help-all gives [])
                picked = [t for t in titles if _matches(value, t)]
                if not picked:
                    p.error(f"--help {value}: no such group; use one of {keys}, or all")
                text = format_help(p, groups=picked)
            else:
                more = (
                    f"More: --help GROUP shows one group ({keys}); --help-all shows all {count} flags. {p.epilog or ''}"
                )
                # a user's own task (--task module:function): its flags are what that user came to see
                own = [t for t in titles if t.endswith(" task") and ":" in t]
                text = format_help(p, only=common, groups=own or None, footer=more)
            p._print_message(text, sys.stdout)
            p.exit()

    parser.add_argument("-h", "--help", nargs="?", metavar="GROUP", action=Help, dest="help",
                        default=argparse.SUPPRESS, help="the common flags; with GROUP, that group's flags")  # fmt: skip
    parser.add_argument("--help-all", nargs=0, action=Help, dest="help", default=argparse.SUPPRESS,
                        help="every flag, by group")  # fmt: skip


# ------------------------------------------------------------------------------------------- config files
Converter = type[int] | type[float] | type[bool]
_PER_GPU = {"samples_per_gpu": ("batch_size", int), "workers_per_gpu": ("num_workers", int)}  # also top-level keys
# mmseg/mmcv config names by table ("": the top level): key -> (our key, converter)
_MMSEG_TABLES: dict[str, dict[str, tuple[str, Converter]]] = {
    "": {**_PER_GPU, "total_iters": ("max_batches", int)},
    "data": {**_PER_GPU, "pin_memory": ("pin_memory", bool), "persistent_workers": ("persistent_workers", bool),
             "prefetch_factor": ("prefetch_factor", int)},
    "runner": {"accumulative_counts": ("accumulate_grad_batches", int), "max_epochs": ("epochs", int),
               "max_iters": ("max_batches", int)},  # mmseg iterations are batches, not optimizer steps
    "evaluation": {"interval": ("val_check_batches", int)},
    "optimizer_config": {"cumulative_iters": ("accumulate_grad_batches", int)},
    "optimizer": {"lr": ("lr", float), "weight_decay": ("weight_decay", float)},
    "checkpoint_config": {"interval": ("checkpoint_every", int)},
}  # fmt: skip
_MMSEG = {(table, key): ours for table, keys in _MMSEG_TABLES.items() for key, ours in keys.items()}
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


MAX_CONFIG_BYTES = 16 * 2**20
MAX_CONFIG_VALUES = 100_000  # values after YAML aliases are expanded; a config file holds a few dozen settings
MAX_CONFIG_DEPTH = 32


def _lines_of(text: str, key: object) -> list[int]:
    """The 1-based lines where `key` is set (`key = `, `key:`, `"key":`), in order."""
    pat = re.compile(rf"""^\s*(?:-\s*)?["']?{re.escape(str(key))}["']?\s*[:=]""")
    return [i for i, line in enumerate(text.splitlines(), 1) if pat.search(line) or f'"{key}":' in line]


def _twice(path: Path, text: str, key: object, lines: tuple[int | None, int | None] = (None, None)) -> ConfigError:
    first, again = lines
    if again is None:
        found = _lines_of(text, key)
        first, again = (found[0], found[1]) if len(found) > 1 else (None, None)
    where = f" on line {again} (first on line {first})" if again is not None else ""
    return ConfigError(f"{path}: {key!r} is set twice{where}; keep one of them")


def _bounded(obj: object, path: Path) -> None:
    """Refuse a structure with more values than a config can mean (a YAML alias bomb expands each alias where it is
    used: 9 aliases of 9 make 387 million) or nested deeper than MAX_CONFIG_DEPTH; stops at the first excess. A value
    no setting takes (a YAML !!set, !!binary, a date) is refused too, by its key: a set would pass for a list."""
    stack: list[tuple[object, int, object]] = [(obj, 0, None)]
    seen = 0
    while stack:
        o, depth, key = stack.pop()
        if not isinstance(o, str | int | float | bool | list | tuple | dict | type(None)):
            kind = "a set (YAML !!set)" if isinstance(o, set | frozenset) else f"a {type(o).__name__}"
            raise ConfigError(
                f"{path}: {key!r} is {kind}; a setting is a number, text, true/false or a list ([a, b]; quote a date)"
            )
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{path}: more than {MAX_CONFIG_VALUES} values once its aliases are expanded; a config file is a few "
                f"lines of settings (write the values out, without nested &anchors/*aliases)"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{path}: nested deeper than {MAX_CONFIG_DEPTH} levels; a config file is flat settings")
        if isinstance(o, dict):
            stack.extend((v, depth + 1, k) for k, v in o.items())
        elif isinstance(o, list | tuple):
            stack.extend((v, depth + 1, key) for v in o)


_MERGE = "tag:yaml.org,2002:merge"  # YAML's `<<` key


def _yaml_loader(path: Path) -> type[yaml.SafeLoader]:
    """PyYAML's SafeLoader that refuses a key set twice in one mapping, naming both lines."""
    import yaml

    class Strict(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, object]:
            if isinstance(node, yaml.MappingNode):
                seen: dict[object, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == _MERGE:  # `<<: *base`: explicit keys may override it
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise _twice(path, "", key, (seen[key], line))
                        seen[key] = line
                    except TypeError:  # an unhashable key: SafeLoader's own error says so
                        pass
            return super().construct_mapping(node, deep)

        def construct_document(self, node: yaml.Node) -> object:
            """A top-level block used only as a `<<: *base` merge source is a template, not a setting: dropped."""
            if isinstance(node, yaml.MappingNode):
                sources, stack, seen = set(), [node], set()
                while stack:  # every mapping once (aliases share nodes), iteratively (no recursion limit)
                    n = stack.pop()
                    if id(n) in seen or not isinstance(n, yaml.MappingNode | yaml.SequenceNode):
                        continue
                    seen.add(id(n))
                    pairs = n.value if isinstance(n, yaml.MappingNode) else [(None, v) for v in n.value]
                    for k, v in pairs:
                        if k is not None and k.tag == _MERGE:
                            sources |= {id(m) for m in (v.value if isinstance(v, yaml.SequenceNode) else [v])}
                        stack.append(v)
                node.value = [(k, v) for k, v in node.value if id(v) not in sources or k.tag == _MERGE
                              or (isinstance(k.value, str) and k.value in ("train", "task", "run"))]  # fmt: skip
            return super().construct_document(node)

    return Strict


def _json_pairs(path: Path, text: str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for k, v in items:
            if k in out:
                raise _twice(path, text, k)
            out[k] = v
        return out

    return pairs


def _read(path: Path) -> tuple[object, str]:
    """The file's settings (bounded in size, nesting and alias expansion; a key set twice refused) and its text."""
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json", ".yaml", ".yml"):
        raise ConfigError(f"{path}: unknown config format {suffix or '(no suffix)'!r}; use .toml, .json or .yaml")
    try:
        data = path.read_bytes()[: MAX_CONFIG_BYTES + 1]
        if len(data) > MAX_CONFIG_BYTES:  # in bytes: 16 MiB of multi-byte text is fewer characters
            raise ConfigError(f"{path}: larger than 16 MiB; a config file is a few lines of settings")
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
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
            raw: object = tomllib.loads(text)
        elif suffix == ".json":
            raw = json.loads(text, object_pairs_hook=_json_pairs(path, text))
        else:
            try:
                import yaml
            except ImportError:
                raise ConfigError(f"{path}: reading YAML needs PyYAML (`pip install pyyaml`); or use .toml") from None
            raw = yaml.load(text, Loader=_yaml_loader(path)) or {}  # noqa: S506 (a SafeLoader)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{path}: nested deeper than Python can read; a config file is flat settings") from None
    except Exception as e:  # the parsers' own messages carry line and column
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "integer string conversion" in first:  # Python's own limit, named in its terms: say it in ours
            at = re.search(r"\d{4000,}", text)
            line = f" on line {text.count(chr(10), 0, at.start()) + 1}" if at else ""
            raise ConfigError(f"{path}: a number of thousands of digits{line}; give a setting's value") from None
        mark = getattr(e, "problem_mark", None)  # PyYAML: the problem's position is on a later line of its message
        problem = getattr(e, "problem", None)
        if mark is not None and problem:
            tab = " (YAML indents with spaces, not tabs)" if "\\t" in str(problem) else ""
            first = f"line {mark.line + 1}, column {mark.column + 1}: {problem}{tab}"
        if first.startswith("Cannot overwrite a value"):  # tomllib: a key set twice in one table
            at = re.search(r"line (\d+)", first)
            line = text.splitlines()[int(at.group(1)) - 1].strip() if at else ""
            fix = ("a key of that name is set above it: a task's name goes under [run] (task = ...)"
                   if line.startswith("[") else "keep one of them")  # fmt: skip
            raise ConfigError(f"{path}: {line!r} sets a name set before "
                              f"{first.removeprefix('Cannot overwrite a value ')}; {fix}") from None  # fmt: skip
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {first}") from None
    _bounded(raw, path)
    return raw, text


def load_config_file(path: str | Path, notes: list[str] | None = None, what: str = "--config") -> dict[str, object]:
    """Flat {flag name: value} from a config file; mmseg aliases translated (one note each into `notes`)."""
    path = Path(path)
    if not path.is_file():
        why = (
            "is a directory; give the config file inside it"
            if path.is_dir()
            else "is not a regular file (a FIFO or device?)"
            if path.exists()
            else "no such file"
        )
        raise ConfigError(f"{what} {path}: {why}")
    raw, text = _read(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a table of settings")
    notes = [] if notes is None else notes
    flat = _Once(path, text)
    for key, value in raw.items():
        if isinstance(value, dict) and key in ("train", "task", "run"):
            flat.set_all(value)
        elif isinstance(value, dict) and key == "fp16":  # mmcv: fp16 = dict(loss_scale=512.)
            scale = value.get("loss_scale", "dynamic")
            flat["precision"], flat["loss_scale"] = "16-mixed", str(scale)
            notes.append(f"config: mmseg fp16.loss_scale={scale} -> precision 16-mixed, loss_scale {scale}")
        elif isinstance(value, dict):
            for sub, v in value.items():
                if (key, sub) in _MMSEG:
                    ours, conv = _MMSEG[(key, sub)]
                    flat[ours] = _mm(conv, v, path, f"{key}.{sub}")
                    notes.append(f"config: mmseg {key}.{sub}={v} -> {ours}={flat[ours]}")
                elif key == "optimizer_config" and sub == "grad_clip" and isinstance(v, dict) and "max_norm" in v:
                    flat["gradient_clip_val"] = _mm(float, v["max_norm"], path, f"{key}.{sub}.max_norm")
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
            flat[ours] = _mm(conv, value, path, key)
            notes.append(f"config: mmseg {key}={value} -> {ours}={flat[ours]}")
        else:
            flat[key] = value
    return dict(flat)


class _Once(dict[str, object]):
    """The flat settings of one file: a key given twice (at the top level and in [train], or by its mmseg name
    and ours) is refused with the line it repeats on."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__()
        self.path, self.text = path, text

    def __setitem__(self, key: str, value: object) -> None:
        if key in self:
            raise _twice(self.path, self.text, key)
        super().__setitem__(key, value)

    def set_all(self, values: Mapping[str, object]) -> None:
        for k, v in values.items():
            self[k] = v


def _mm(conv: Converter, v: object, path: Path, key: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float | str) or (conv is bool and not isinstance(v, bool)):
        if not (conv is bool and isinstance(v, bool)):
            raise ConfigError(f"{path}: {key} = {v!r}: not a {conv.__name__}")
    try:
        return conv(v)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{path}: {key} = {v!r}: not a {conv.__name__}") from None
