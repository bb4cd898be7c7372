"""The Python API page's generated parts (docs/reference/api.md), from the engine itself.

- `<!-- api:public -->`: a mkdocstrings block for each name in `trainer.__all__` that the page does not already
  render, so a new public class or function appears on the page without anyone adding it (a name the installed
  package takes from the command line's tools, `trainer.APP_TOOLS`, is rendered from its module there);
- `<!-- api:constructor trainer.NAME -->`: a dataclass's constructor as `NAME(required, ..., **fields)` and a
  table of its fields (type, default, what it is) in place of one endless signature line (`... no-table`: the
  constructor line alone, when the page has the table elsewhere);
- `<!-- api:trainconfig-fields -->`: the TrainConfig fields, one table per group: name, type, default, help.

The manual's build (scripts/mkdocs_hooks.py) calls render() on every page.
python scripts/docs_api.py   # print the fields table (Markdown) for a reader without mkdocs
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PUBLIC = "<!-- api:public -->"
FIELDS = "<!-- api:trainconfig-fields -->"
CONSTRUCTOR = re.compile(r"^<!-- api:constructor ([\w.]+)( no-table)? -->$", re.M)
SHOWN = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def public_path(name: str) -> str:
    """The dotted path mkdocstrings renders a public name from: trainer.NAME, or for a name the installed package
    takes from the command line's tools (trainer.APP_TOOLS, not in a copied trainer/) its module's path."""
    import trainer

    module = getattr(trainer, "APP_TOOLS", {}).get(name)
    return f"{module}.{name}" if module else f"trainer.{name}"


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def public_blocks(markdown: str) -> str:
    """A `::: path` block for each public name the page has no `::: path` line for yet; a dataclass with its
    constructor and fields table instead of its signature."""
    import trainer

    shown = set(SHOWN.findall(markdown))
    blocks = []
    for name in trainer.__all__:
        path = public_path(name)
        if path in shown:
            continue
        dataclass, app = dataclasses.is_dataclass(_resolve(path)), not path.startswith("trainer.")
        options = ["show_signature: false"] * dataclass + ["show_root_full_path: true"] * app  # heading: its module
        block = f"::: {path}" + ("\n    options:" + "".join(f"\n      {o}" for o in options) if options else "")
        if dataclass:
            block += f"\n\n{constructor(path)}"
        if app:
            block += (
                f"\n\nInstalled with pip: `from plainloop import {name}`; in plainloop's repository: "
                f"`from {path.rpartition('.')[0]} import {name}` (it is not part of a copied `trainer/` folder)."
            )
        blocks.append(block)
    return "\n\n".join(blocks)


def _comments(cls: type) -> dict[str, str]:
    """{field: the comment on its line, or the comment lines just above it} from the class's source."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("# "))
            continue
        m = re.match(r"(\w+)\s*:", text)
        if m:
            trailing = text.partition("  # ")[2].strip()
            out[m.group(1)] = trailing or " ".join(above)  # its own comment, else the lines above it
        above = []
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "required"


def constructor(path: str, table: bool = True) -> str:
    """A dataclass's constructor, `NAME(required, ..., **fields)`, and a table of every field: name, type, default,
    and what it is (its help text, else the comment beside it in the source)."""
    cls = _resolve(path)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"<!-- api:constructor {path} -->: {path} is not a dataclass; use a plain `::: {path}`")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    required = [f.name for f in fields if _default(f) == "required"]
    name = cls.__name__
    call = f"{name}({', '.join([*required, '**fields'])})"
    notes = _comments(cls)
    rows = [
        f"| `{f.name}` | `{_type(f.type)}` | {_default(f)} | {_cell(f.metadata.get('help') or notes.get(f.name, ''))} |"
        for f in fields
    ]
    head = f"`{call}`: {'the required fields first (also by position), then ' if required else ''}any field by keyword."
    if not table:
        return head
    return "\n".join([head, "", "| field | type | default | what it is |", "|---|---|---|---|", *rows])


def _type(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "").replace("|", "or")  # a table cell: no pipes


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "/")


def fields_table() -> str:
    """One table per TrainConfig group (the --help groups): field, type, default, what it does."""
    from trainer.config import TrainConfig

    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if callable(f.default_factory) else f.default
        row = f"| `{f.name}` | `{_type(f.type)}` | `{default!r}` | {_cell(f.metadata.get('help', ''))} |"
        groups.setdefault(str(f.metadata.get("group", "other")), []).append(row)
    parts = []
    for group, rows in groups.items():
        title = group[:1].upper() + group[1:]
        parts.append("\n".join([f"### {title}", "", "| field | type | default | what it does |", "|---|---|---|---|"]))
        parts[-1] += "\n" + "\n".join(rows)
    return "\n\n".join(parts)


def render(markdown: str) -> str:
    """The page with its API markers replaced by the generated parts."""
    markdown = CONSTRUCTOR.sub(lambda m: constructor(m.group(1), table=not m.group(2)), markdown)
    if PUBLIC in markdown:
        markdown = markdown.replace(PUBLIC, public_blocks(markdown))
    if FIELDS in markdown:
        markdown = markdown.replace(FIELDS, fields_table())
    return markdown


if __name__ == "__main__":
    print(fields_table())
