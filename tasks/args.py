"""Task arguments checked by the same validator as every other setting (trainer.config.check_value).

A task module keeps, beside ARGS_HELP, ARGS_RULES = {parameter: rule} with the knob keywords of trainer/config.py
(min, max, gt, choices, check, ...). The CLI builds its flags from them and the builder calls `check_task_args`
first, so a value is checked by one rule whether it came from a flag, a config file or Python.
"""

from __future__ import annotations

import errno
import inspect
import os
import stat
import typing
from collections.abc import Callable
from typing import Any

from trainer.config import check_value


def check_task_args(fn: Callable[..., Any], rules: dict[str, dict[str, Any]], values: dict[str, Any]) -> None:
    """Check each keyword parameter of builder `fn` found in `values` (e.g. the builder's locals()) by its rule;
    a bad one raises ConfigError naming the flag, the value and what is allowed."""
    hints = typing.get_type_hints(fn)
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name in values and name in hints:
            check_value(f"--{name}", values[name], hints[name], rules.get(name, {}))


def input_path_problem(path: str) -> str | None:
    """An input path that exists must be a regular file or a directory: a FIFO would block the reader, a
    device (/dev/zero) would never end, and neither is "not found"."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None  # missing, or a glob: the reader says what it looked for
        return f"cannot be read ({e.strerror or e})"  # too long a name, no permission, a loop of links
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return None
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
    return f"is {kind}, not a data file or directory"
