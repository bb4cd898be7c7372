"""mkdocs hooks for the manual: the flag reference generated at build time, and result files served with the site.

Registered in mkdocs.yml (`hooks:`). Nothing here downloads anything: the site builds offline.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_flags  # noqa: E402

# repository folders the pages link into (raw JSON, rendered tables, figures, example configs)
MOUNTED = ("benchmarks/results", "configs")


def on_files(files, config):
    for folder in MOUNTED:
        for path in sorted((ROOT / folder).iterdir()):
            if path.is_file() and not path.name.startswith("."):
                files.append(
                    File(
                        f"{folder}/{path.name}",
                        src_dir=str(ROOT),
                        dest_dir=config["site_dir"],
                        use_directory_urls=config["use_directory_urls"],
                    )
                )
    return files


def on_page_markdown(markdown, page, config, files):
    return docs_flags.render(markdown)
