"""mkdocs hooks for the manual: the flag reference and the API page's generated parts, the pictures drawn from a
committed run, and result files served with the site.

Registered in mkdocs.yml (`hooks:`). Nothing here downloads anything: the site builds offline.

The pictures: docs/assets/demo-run/ holds the demo's metrics.jsonl, summary.json and test_month.npz (a run of
`python train_optimized.py`, the default ERA5 demo on the built-in sample). Each build draws curves.png,
throughput.png and test_month_maps.png from them with utils.plot, as a run does, and serves them as
assets/plots/*.png; a picture that cannot be drawn stops the build.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_api  # noqa: E402
import docs_flags  # noqa: E402

# repository folders the pages link into (raw JSON, rendered tables, figures, example configs)
MOUNTED = ("benchmarks/results", "configs")
DEMO_RUN = ROOT / "docs" / "assets" / "demo-run"
PICTURES = ("curves.png", "throughput.png", "test_month_maps.png")  # the pages show each one


def draw_pictures(out: Path) -> list[Path]:
    """The run's plots drawn from the committed demo run, into `out`; every one of PICTURES or PluginError."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from utils.plot import plot_run

    run = out / "demo-run"
    shutil.copytree(DEMO_RUN, run)
    try:
        written = {p.name: p for p in plot_run(run)}
    except (ImportError, OSError, ValueError) as e:
        raise PluginError(f"the manual's pictures: drawing them from {DEMO_RUN} failed: {e}") from e
    missing = [name for name in PICTURES if name not in written]
    if missing:
        raise PluginError(f"the manual's pictures: {DEMO_RUN} gave no {', '.join(missing)}")
    return [written[name] for name in PICTURES]


def on_files(files: Files, config: MkDocsConfig) -> Files:
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
    scratch = Path(tempfile.mkdtemp(prefix="plainloop-docs-"))
    for path in draw_pictures(scratch):
        files.append(File.generated(config, f"assets/plots/{path.name}", content=path.read_bytes()))
    shutil.rmtree(scratch, ignore_errors=True)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return docs_api.render(docs_flags.render(markdown))
