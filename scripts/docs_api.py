"""The Python API page's generated parts (docs/reference/api.md), from the engine itself.

- `<!-- api:public -->`: a mkdocstrings block for each name in `trainer.__all__` that the page does not already
  render, so a new public class or function appears on the page without anyone adding it;
- `<!-- api:trainconfig-fields -->`: the TrainConfig fields, one table per group: name, type, default, help.

The manual's build (scripts/mkdocs_hooks.py) calls render() on every page.
python scripts/docs_api.py   # print the fields table (Markdown) for a reader without mkdocs
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PUBLIC = "<!-- api:public -->"
FIELDS = "<!-- api:trainconfig-fields -->"


def public_blocks(markdown: str) -> str:
    """`::: trainer.NAME` for each public name the page has no `::: trainer.NAME` line for yet."""
    import trainer

    shown = set(re.findall(r"^::: trainer\.(\w+)\s*$", markdown, re.M))
    return "\n\n".join(f"::: trainer.{name}" for name in trainer.__all__ if name not in shown)


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
    if PUBLIC in markdown:
        markdown = markdown.replace(PUBLIC, public_blocks(markdown))
    if FIELDS in markdown:
        markdown = markdown.replace(FIELDS, fields_table())
    return markdown


if __name__ == "__main__":
    print(fields_table())
