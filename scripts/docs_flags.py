"""The flag reference of docs/reference/flags.md, generated from its one source (TrainConfig, RunOptions, the tasks).

The manual's build (scripts/mkdocs_hooks.py) calls render() on every page, so the page never goes stale.
python scripts/docs_flags.py   # print the generated tables (Markdown) for a reader without mkdocs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = "<!-- flags:all -->"
HEADINGS = {"era5 task": "ERA5 task", "reid task": "Re-ID task"}


def _default(action: argparse.Action) -> str:
    m = re.search(r"\(default: (.*)\)\s*$", action.help or "", re.S)
    if m:
        return m.group(1).replace("%%", "%")
    if action.default is None or action.default is argparse.SUPPRESS:
        return ""
    return str(action.default)


def _flag(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "`, `".join(action.option_strings)  # one code span each, so a narrow column breaks between them
    return max(action.option_strings, key=len)


def groups() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """[(group title, [(flag, default, help)])] in the order of train_optimized.py's argparse groups."""
    import dataclasses

    import train_optimized as cli
    from trainer.config import TrainConfig

    training = {f.name for f in dataclasses.fields(TrainConfig)}

    def rank(group: argparse._ArgumentGroup) -> int:
        """The run's own options, then the training knobs, then each task's, then the measurement tools."""
        dests = {a.dest for a in group._group_actions}
        if dests & training:
            return 1
        if (group.title or "").endswith("task"):
            return 2
        if any("tool" in (group.title or "") or a.dest in ("profile", "system_report") for a in group._group_actions):
            return 3
        return 0

    out = []
    for group in sorted(cli.build_parser()._action_groups, key=rank):
        rows = []
        for a in group._group_actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or a.dest in ("help", "help_all"):
                continue
            what = re.sub(r"\s*\(default: .*\)\s*$", "", a.help or "", flags=re.S).replace("%%", "%")
            rows.append((_flag(a), _default(a), " ".join(what.split())))
        if rows:
            out.append((group.title or "options", rows))
    return out


def tables() -> str:
    """One Markdown section per argparse group: a heading and a flag / default / what-it-does table."""
    parts = []
    for title, rows in groups():
        lines = [
            f"### {HEADINGS.get(title, title[:1].upper() + title[1:])}",
            "",
            "| flag | default | what it does |",
            "|---|---|---|",
        ]
        for flag, default, what in rows:
            default = default.replace("|", "/") or " "
            lines.append(f"| `{flag}` | {default} | {what.replace('|', '/')} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def render(markdown: str) -> str:
    """The page with its flags marker replaced by the generated tables."""
    return markdown.replace(MARKER, tables()) if MARKER in markdown else markdown


if __name__ == "__main__":
    print(tables())
