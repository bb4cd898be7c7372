"""Typed values: convert a value to a dataclass field's type and check its rule, one line per bad value.

A field declared with `knob(default, help, group, **rule)` carries its rule in its metadata:

    lr: float = knob(1e-3, "learning rate", "optimizer", gt=0)      # a finite float > 0
    warmup_steps: int | None = knob(None, "...", "optimizer", min=0)  # None or a whole number >= 0

The rule keywords (any mix; a tuple field applies them to each element, check= to the whole tuple):
    choices=(...)   one of these values                  min= / max=   inclusive bounds
    gt=             exclusive lower bound                 allow_inf=True  floats may be +-inf (default: finite)
    allow_empty=True   "" is allowed for a str field     check=fn      fn(value) -> error text or None
    aliases=("old",)   earlier names, still accepted with a one-line note
The type comes from the annotation: ints are whole numbers in [-2**31, 2**31) unless min/max say otherwise,
floats are finite, strings are valid UTF-8 without control characters and, unless allow_empty, not empty.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A bad config file, key or value: the message names it and what to do."""


def unknown_keys(d: Iterable[object], known: Iterable[str]) -> list[str]:
    """'key (did you mean ...?)' for each key of `d` not in `known`."""
    known = list(known)
    near = [(k, difflib.get_close_matches(str(k).lower(), known, n=3, cutoff=0.6)) for k in d if k not in known]
    return [f"{k!r}" + (f" (did you mean {', '.join(n)}?)" if n else "") for k, n in near]


INT_LIMIT = 2**31  # whole numbers live in [-INT_LIMIT, INT_LIMIT) unless a field's min/max say otherwise
RULE_KEYS = ("choices", "min", "max", "gt", "allow_inf", "allow_empty", "check", "aliases")


TypeForm = Any  # a field's annotation (int, str | None, tuple[float, float], Literal[...]): typing's own forms
Rule = Mapping[str, Any]  # a knob's metadata: help, group and the rule keywords (values of many types)
Rules = dict[str, tuple[TypeForm, Rule]]  # {field name: (type, metadata)}


def knob(default: Any, help: str, group: str, **rule: Any) -> Any:  # noqa: A002 (argparse's word)
    """A dataclass field with its help text, flag group and rule (keywords: see the module docstring)."""
    unknown = set(rule) - set(RULE_KEYS) - {"metavar"}
    if unknown:
        raise TypeError(f"knob(): unknown rule keyword(s) {sorted(unknown)}; use {', '.join(RULE_KEYS)}")
    return field(default=default, metadata={"help": help, "group": group, **rule})


# ------------------------------------------------------------------------------------------- the validator
def unwrap(tp: TypeForm) -> tuple[TypeForm, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), type(None) in typing.get_args(tp)
    return tp, False


def _base(tp: TypeForm, rule: Rule) -> tuple[TypeForm, bool, Rule]:
    """unwrap(tp) and the rule, a Literal's values becoming the rule's choices."""
    base, optional = unwrap(tp)
    if typing.get_origin(base) is typing.Literal:
        return type(typing.get_args(base)[0]), optional, {"choices": typing.get_args(base), **rule}
    return base, optional, rule


def show_value(v: object) -> str:
    if isinstance(v, str):
        if len(v) > 80:  # the message stays one readable line
            return f"{show_value(v[:60])}... ({len(v)} characters)"
        return repr(v) if (not v or any(c.isspace() or not c.isprintable() for c in v)) else v
    if isinstance(v, list | tuple):  # a long list: its start and its length, not 200 KB of values
        return " ".join(show_value(x) for x in v[:8]) + (f" ... ({len(v)} values)" if len(v) > 8 else "")
    return str(v)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def _at(label: str, v: object) -> str:
    """'--lr nan' for a flag; "where: key=value" (Python's repr for text) for a file or dict key."""
    if label.endswith("="):
        return label + (show_value(v) if not isinstance(v, str) or len(v) > 80 else repr(v))
    return f"{label} {show_value(v)}"


def describe(tp: TypeForm, rule: Rule, implicit: bool = False) -> str:
    """What a value of this type and rule may be, in words: 'a finite number > 0', 'a whole number >= 1'."""
    base, optional, rule = _base(tp, rule)
    if "choices" in rule:
        return "one of " + ", ".join(str(c) for c in rule["choices"])
    if base is bool:
        return "on or off (true or false)" + (" or auto" if optional else "")
    if typing.get_origin(base) in (tuple, list):
        args = typing.get_args(base)
        n = "" if (not args or args[-1] is Ellipsis or typing.get_origin(base) is list) else f"{len(args)} "
        return f"{n}values, each {describe(args[0] if args else str, rule)}"
    if base not in (int, float):
        return "a text value" if rule.get("allow_empty") else "a non-empty text value"
    what = "a whole number" if base is int else ("a number" if rule.get("allow_inf") else "a finite number")
    lo, hi, gt = rule.get("min"), rule.get("max"), rule.get("gt")
    if base is int and implicit:  # the implicit bounds of a whole number, said when a value broke them
        hi = INT_LIMIT - 1 if hi is None else hi
        lo = -INT_LIMIT if (lo is None and gt is None) else lo
    if lo is not None and hi is not None:
        return f"{what} in [{_num(lo)}, {_num(hi)}]"
    if gt is not None:
        return f"{what} > {_num(gt)}" + (f" and <= {_num(hi)}" if hi is not None else "")
    if lo is not None:
        return f"{what} >= {_num(lo)}"
    return what if hi is None else f"{what} <= {_num(hi)}"


def _convert(v: object, base: TypeForm) -> object:
    """One value to `base` (bool, int, float, str); TypeError/ValueError when it is not one."""
    if base in (int, float) and isinstance(v, bool):
        raise TypeError(v)  # True is not the number 1 here
    if base is bool:
        if isinstance(v, bool):
            return v
        s = v.strip().lower() if isinstance(v, str) else ""
        if s in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return s in ("1", "true", "yes", "on")
        raise ValueError(v)
    if base is int:
        if isinstance(v, int):
            return v
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)
        if isinstance(v, str) and v.strip().lstrip("+-").isdigit() and len(v.strip()) <= 40:
            return int(v.strip(), 10)
        raise ValueError(v)
    if base is float:
        if isinstance(v, int | float) or (isinstance(v, str) and len(v) <= 100):
            return float(v)  # float() strips the spaces around a number itself
        raise ValueError(v)
    if isinstance(v, str | os.PathLike):
        return os.fspath(v)
    if isinstance(v, int | float) and not isinstance(v, bool) and base is str:
        return str(v)  # a config file's `loss_scale = 1024`
    raise TypeError(v)


def _problem(v: object, base: TypeForm, rule: Rule) -> str | None:
    """Why a converted value breaks the rule (None: it does not)."""
    if "choices" in rule and v not in rule["choices"]:
        return "not allowed"
    if isinstance(v, float) and not rule.get("allow_inf") and not math.isfinite(v):
        return "not finite"
    if isinstance(v, float) and math.isnan(v):
        return "not a number"
    if isinstance(v, int | float) and not isinstance(v, bool):
        lo, hi, gt = rule.get("min"), rule.get("max"), rule.get("gt")
        if base is int and lo is None and gt is None and v < -INT_LIMIT:
            return "too small"
        if base is int and hi is None and v >= INT_LIMIT:
            return "too large"
        if (lo is not None and v < lo) or (gt is not None and not v > gt) or (hi is not None and v > hi):
            return "out of range"
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return "not valid UTF-8"
        if any(ord(c) < 32 or ord(c) == 127 for c in v):
            return "holds a control character"
        if not v and not rule.get("allow_empty") and "choices" not in rule:
            return "empty"
    return None


def check_value(label: str, value: object, tp: TypeForm, rule: Rule) -> Any:
    """Convert `value` to the type `tp` and check `rule` (a knob's metadata); returns the converted value.

    A bad value raises ConfigError("<label> <value>: <why>; use <what is allowed>"), e.g.
    "--lr nan: not finite; use a finite number > 0". `label` names the flag or key as the user wrote it."""
    base, optional, rule = _base(tp, rule)
    allowed = describe(tp, rule)
    auto = isinstance(value, str) and value.strip().lower() in ("auto", "none")
    if value is None or (optional and base is bool and auto):
        if optional:
            return None
        raise ConfigError(f"{label}: cannot be empty; use {allowed}")
    sequence = typing.get_origin(base) in (tuple, list)
    try:
        if sequence:
            args = typing.get_args(base)
            elem = args[0] if args else str
            if isinstance(value, str | bytes) or not isinstance(value, Iterable):
                raise TypeError(value)
            items = list(value)
            if args and args[-1] is not Ellipsis and typing.get_origin(base) is tuple and len(items) != len(args):
                raise ConfigError(f"{_at(label, items)}: give {len(args)} values; use {allowed}")
            out = []
            for x in items:  # each element converted, then checked, in order: the first bad one is named
                try:
                    out.append(_convert(x, elem))
                except (TypeError, ValueError, OverflowError):
                    kind = describe(elem, rule).split(" in ")[0].split(" >")[0]
                    raise ConfigError(f"{_at(label, items)}: {show_value(x)} is not {kind}; use {allowed}") from None
                why = _problem(out[-1], elem, rule)
                if why:
                    raise ConfigError(f"{_at(label, items)}: {show_value(x)} is {why}; use {allowed}")
            converted: object = tuple(out)
        else:
            converted = _convert(value, base)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):
        if isinstance(value, str | int | float):
            at = _at(label, value)
        else:  # a list, dict or object: its type, not its text
            at = f"{label}{'' if label.endswith('=') else ' '}({type(value).__name__})"
        what = allowed.split(" in ")[0].split(" >")[0]
        why = "not understood" if what == allowed else f"not {what}"  # "not X; use X" says it twice
        raise ConfigError(f"{at}: {why}; use {allowed}") from None
    why = None if sequence else _problem(converted, base, rule)
    if why:
        if why in ("too large", "too small"):
            allowed = describe(tp, rule, implicit=True)
        raise ConfigError(f"{_at(label, converted)}: {why}; use {allowed}")
    msg = rule["check"](converted) if rule.get("check") else None
    if msg:
        raise ConfigError(f"{_at(label, items if sequence else converted)}: {msg}")
    return converted


_RULES: dict[type, Rules] = {}


def field_rules(cls: type) -> Rules:
    """{field name: (type, metadata)} of a dataclass whose fields are knobs (computed once per class)."""
    if cls not in _RULES:
        hints = typing.get_type_hints(cls)
        _RULES[cls] = {f.name: (hints[f.name], dict(f.metadata)) for f in dataclasses.fields(cls)}
    return _RULES[cls]


def check_settings(
    values: Mapping[str, object],
    rules: Rules,
    where: str,
    notes: list[str] | None = None,
    style: str = "key",
    valid: str = "",
) -> dict[str, Any]:
    """Check a whole dict of settings (a config file, a dict from code): unknown keys name the nearest valid
    ones, old names become the current ones (a note each), every value is converted and checked by its rule.
    style "key" labels a value "<where>: <key> =", "flag" labels it "--<key>"; `valid` ends the line of an
    unknown key (where the valid settings are listed)."""
    old = {alias: name for name, (_, rule) in rules.items() for alias in rule.get("aliases", ())}
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k in old and k not in rules:
            if notes is not None:
                notes.append(f"{where}: {k} is now called {old[k]}; read as {old[k]}")
            k = old[k]
        out[k] = v
    hints = unknown_keys(out, [*rules, *old])
    if hints:
        raise ConfigError(f"{where}: unknown setting(s) {'; '.join(hints)}." + (f" {valid}" if valid else ""))
    return {k: check_value(f"--{k}" if style == "flag" else f"{where}: {k}=", v, *rules[k]) for k, v in out.items()}
