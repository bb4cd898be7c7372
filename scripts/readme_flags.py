"""Regenerate the README's flag tables from their one source (TrainConfig, RunOptions, the task builders).

python scripts/readme_flags.py           # rewrite the blocks between <!-- flags:NAME --> markers
python scripts/readme_flags.py --check   # exit 1 if README.md is out of date (tests/test_config.py runs it)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train_optimized as cli  # noqa: E402


def _default(action: argparse.Action) -> str:
    m = re.search(r"\(default: (.*)\)\s*$", action.help or "", re.S)
    return m.group(1).replace("%%", "%") if m else ""


def tables() -> dict[str, str]:
    """{block name: markdown table} for each argparse group of the CLI."""
    out: dict[str, list[str]] = {}
    names = {"task and run": "run", "measurement tools": "tools", "era5 task": "era5", "reid task": "reid"}
    for group in cli.build_parser()._action_groups:
        key = names.get(group.title, "train")
        rows = out.setdefault(key, ["| flag | default | what it does |", "|---|---|---|"])
        for a in group._group_actions:
            if not a.option_strings or a.dest == "help":
                continue
            flag = (
                max(a.option_strings, key=len)
                if not isinstance(a, argparse.BooleanOptionalAction)
                else (f"{a.option_strings[0]}, {a.option_strings[1]}")
            )
            what = re.sub(r"\s*\(default: .*\)\s*$", "", a.help or "", flags=re.S).replace("%%", "%")
            if key == "train":
                what = f"*{group.title}:* {what}"
            rows.append(f"| `{flag}` | {_default(a)} | {what.replace('|', '/')} |")
    return {k: "\n".join(v) for k, v in out.items()}


def render(text: str) -> str:
    for name, table in tables().items():
        pat = re.compile(rf"(<!-- flags:{name} -->\n)(?:.*?\n)?(<!-- /flags:{name} -->)", re.S)
        text = pat.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if README.md is out of date")
    a = ap.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = render(text)
    if a.check:
        if new != text:
            print("README.md flag tables are out of date: run python scripts/readme_flags.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
