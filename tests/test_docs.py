"""The manual (docs/, mkdocs) and the README: the site builds with --strict, every example is run, checked or
marked as not runnable here, and the README stays a short front door.

The example markers are described in CONTRIBUTING.md ("Every example is run, checked or marked").
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
GENERATED = {DOCS / "system_report_cpu.md"}  # written by a tool, not prose
PAGES = sorted(DOCS.rglob("*.md"))
SOURCES = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *PAGES]
CODE_LANGS = {"python", "py", "bash", "sh", "shell", "console"}
MARKER = re.compile(r"^\s*<!-- example: (run|check|tested-by \S+|not-run: \S.*?) -->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(path: Path) -> list[dict]:
    """Every fenced block of a Markdown file: language, code, the marker above it (or None), line number."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.group(1), m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            j += 1
        code = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : j])
        above = lines[i - 1] if i > 0 else ""
        marker = MARKER.match(above)
        out.append({"lang": lang, "code": code + "\n", "marker": marker.group(1) if marker else None, "line": i + 1})
        i = j + 1
    return out


def examples(kind: str) -> list:
    found = []
    for path in SOURCES:
        for b in fenced_blocks(path):
            if b["lang"] in CODE_LANGS and (b["marker"] or "").split(" ")[0].rstrip(":") == kind:
                found.append(pytest.param(path, b, id=f"{rel(path)}:{b['line']}"))
    return found


@functools.cache
def plainloop_dir() -> str:
    """A folder where `plainloop` is the repository's trainer/, as `pip install -e .` makes it (examples import it)."""
    folder = Path(tempfile.mkdtemp(prefix="plainloop-import-"))
    (folder / "plainloop").symlink_to(ROOT / "trainer", target_is_directory=True)
    return str(folder)


def env_with_repo() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), plainloop_dir()]), NO_MKDOCS_2_WARNING="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` = this interpreter
    return env


# ---------------------------------------------------------------------------------------------- markers
def test_every_example_is_run_checked_or_marked():
    unmarked = [
        f"{rel(path)}:{b['line']} ({b['lang']})"
        for path in SOURCES
        for b in fenced_blocks(path)
        if b["lang"] in CODE_LANGS and b["marker"] is None
    ]
    assert not unmarked, (
        "these examples have no marker on the line above them; add <!-- example: run -->, <!-- example: check -->, "
        "<!-- example: tested-by tests/FILE.py::TEST --> or <!-- example: not-run: REASON --> "
        f"(see CONTRIBUTING.md): {unmarked}"
    )


def test_markers_are_spelled_right():
    """A marker with a typo would leave its block unmarked; say which line instead."""
    bad = []
    for path in SOURCES:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("<!-- example") and not MARKER.match(line):
                bad.append(f"{rel(path)}:{n}: {line.strip()}")
    assert not bad, f"unknown example markers (see CONTRIBUTING.md): {bad}"


@pytest.mark.parametrize(("path", "block"), examples("tested-by"))
def test_tested_by_names_a_real_test(path, block):
    target = block["marker"].split(" ", 1)[1]
    file, _, name = target.partition("::")
    test_file = ROOT / file
    assert test_file.is_file(), f"{rel(path)}:{block['line']}: {file} does not exist"
    name = name.split("[")[0]
    assert re.search(rf"^def {re.escape(name)}\(", test_file.read_text(encoding="utf-8"), re.M), (
        f"{rel(path)}:{block['line']}: {file} has no test {name}"
    )


# ---------------------------------------------------------------------------------------------- run
@pytest.mark.slow
@pytest.mark.parametrize(("path", "block"), examples("run"))
def test_run_example(path, block, tmp_path):
    """Python runs in a fresh interpreter in a temporary directory (its runs/ land there); bash in the repo root."""
    if block["lang"] in ("python", "py"):
        cmd, cwd = [sys.executable, "-c", block["code"]], tmp_path
    else:
        cmd, cwd = ["bash", "-e", "-o", "pipefail", "-c", block["code"]], ROOT
    proc = subprocess.run(cmd, cwd=cwd, env=env_with_repo(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{rel(path)}:{block['line']} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# ---------------------------------------------------------------------------------------------- check
def command_lines(code: str) -> list[str]:
    return [
        line for line in code.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def check_cli(argv: list[str], where: str, monkeypatch) -> None:
    """The CLI's own parser and settings checks, without training: flags, values, config files, task flags."""
    import train_optimized as cli

    monkeypatch.chdir(ROOT)
    try:
        explicit = vars(cli.build_parser().parse_args(argv))
    except SystemExit as e:
        pytest.fail(f"{where}: train_optimized.py {shlex.join(argv)} exits {e.code} (see the error above)")
    explicit.pop("resume", None)  # the run directory an example resumes does not exist here
    cli.split_settings(cli.resolve_settings(explicit, []))


@pytest.mark.parametrize(("path", "block"), examples("check"))
def test_check_example(path, block, monkeypatch):
    for line in command_lines(block["code"]):
        where = f"{rel(path)}:{block['line']}: {line.strip()}"
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        if "train_optimized.py" in words and words[0] in ("python", "python3", "torchrun"):
            check_cli(words[words.index("train_optimized.py") + 1 :], where, monkeypatch)
        elif words and words[0] == "./optimize_training.sh":
            proc = subprocess.run(
                ["bash", "optimize_training.sh", *words[1:]],
                cwd=ROOT,
                env={**env_with_repo(), **env, "PLAINLOOP_DRY_RUN": "1"},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, f"{where}: the launcher's dry run failed: {proc.stderr[-2000:]}"
            check_cli(words[1:], where, monkeypatch)
        else:
            pytest.fail(f"{where}: cannot be checked without running it; mark the block run or not-run")


# ---------------------------------------------------------------------------------------------- the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs toolchain (requirements-docs.txt) is not installed")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env_with_repo(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    return out


@pytest.mark.slow
def test_the_site_builds_strict(site):
    assert (site / "index.html").is_file()
    assert (site / "benchmarks" / "results" / "run_cpu_native025.json").is_file()  # linked raw results are served


@pytest.mark.slow
def test_the_flag_reference_lists_every_flag(site):
    import train_optimized as cli

    html = (site / "reference" / "flags.html").read_text(encoding="utf-8")
    missing = [
        o
        for a in cli.build_parser()._actions
        if a.option_strings and a.dest not in ("help", "help_all")
        for o in a.option_strings
        if o.startswith("--") and o not in html
    ]
    assert not missing, f"the generated flag reference misses {missing}"


def html_text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).replace("&para;", " ").split())


@pytest.mark.slow
def test_the_api_reference_is_generated_from_docstrings(site):
    """Every public name of plainloop (trainer.__all__) with its constructor: a signature, or for a dataclass
    `NAME(required, **fields)` and a table of its fields (TrainConfig's signature was one endless `knob(...)` line);
    and every TrainConfig field."""
    import dataclasses

    import trainer
    from trainer.config import TrainConfig

    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_api

    html = (site / "reference" / "api.html").read_text(encoding="utf-8")
    text = re.sub(r"\s", "", html_text(html))
    for name in trainer.__all__:
        path = docs_api.public_path(name)  # trainer.NAME, or the module of a measuring tool
        assert f'id="{path}"' in html, f"{name} (in trainer.__all__) is not rendered on the API page as {path}"
    assert 'id="trainer.Trainer.fit"' in html and 'id="trainer.TrainConfig.validate"' in html
    for cls, first in (("Trainer", "cfg"), ("BaseTrainer", "title")):
        assert f"{cls}({first}:" in text, f"the API page does not show {cls}'s constructor ({cls}({first}: ...)"
    assert "TrainConfig(**fields)" in text and "Task(name,model,train_set,**fields)" in text
    assert "knob(" not in text, "a dataclass's signature shows its knob(...) field definitions"
    task_table = html.split('id="trainer.Task"', 1)[1].split('id="trainer.TrainConfig"', 1)[0]
    assert all(f"<code>{f.name}</code>" in task_table for f in dataclasses.fields(trainer.Task))
    fields = html.split('id="trainconfig-fields"', 1)[1]
    missing = [f.name for f in dataclasses.fields(TrainConfig) if f"<code>{f.name}</code>" not in fields]
    assert not missing, f"the API page's TrainConfig table misses {missing}"


PICTURES = ("assets/plots/curves.png", "assets/plots/throughput.png", "assets/plots/test_month_maps.png")


@pytest.mark.slow
def test_the_pictures_are_drawn_and_shown(site):
    """The demo run's plots are drawn from docs/assets/demo-run/ at build time, and pages show them and the skill
    figure."""
    shown = set()
    for page in site.rglob("*.html"):
        for src in re.findall(r'<img[^>]* src="([^"]+)"', page.read_text(encoding="utf-8")):
            target = (page.parent / src).resolve()
            assert target.is_file(), f"{page.relative_to(site)} shows {src}, which is not in the site"
            shown.add(target.relative_to(site.resolve()).as_posix())
    for picture in (*PICTURES, "benchmarks/results/skill_cpu.png"):
        assert (site / picture).stat().st_size > 10_000, f"{picture} is missing or empty"
        assert picture in shown, f"no page shows {picture}"


@pytest.mark.slow
def test_links_work_from_disk(site):
    """Opened as files (file://), a link to a folder shows a directory listing: every link names a file."""
    broken = []
    for page in site.rglob("*.html"):
        if page.name == "404.html":  # served by a web server only, with absolute links
            continue
        for url in re.findall(r'(?:href|src)="([^"#?]+)', page.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:|//", url):
                continue
            if not (page.parent / url).is_file():
                broken.append(f"{page.relative_to(site)}: {url}")
    assert not broken, f"links that name no file in the built site: {broken[:20]}"


def test_build_output_is_ignored_by_git_and_ruff():
    """site/ (mkdocs build), build/ and dist/ (wheels) are never committed, and ruff does not lint them."""
    import tomllib

    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    assert {"site", "build", "dist"} <= set(ruff["extend-exclude"])
    if shutil.which("git") and (ROOT / ".git").exists():
        for path in ("site/index.html", "build/lib/x.py", "dist/x.whl", "plainloop.egg-info/PKG-INFO"):
            proc = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
            assert proc.returncode == 0, f"{path} is not ignored by .gitignore"


def nav_pages() -> list[str]:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda *a: None)
    conf = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)

    def walk(items):
        for item in items:
            for v in item.values() if isinstance(item, dict) else [item]:
                yield from walk(v) if isinstance(v, list) else [v]

    return list(walk(conf["nav"]))


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages()
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml names pages that do not exist: {missing}"
    left_out = [str(p.relative_to(DOCS)) for p in PAGES if str(p.relative_to(DOCS)) not in nav]
    assert not left_out, f"pages not in mkdocs.yml's nav: {left_out}"


# ---------------------------------------------------------------------------------------------- prose and README
def prose_lines(path: Path):
    fence = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fence = not fence
            continue
        if not fence and not line.lstrip().startswith(("|", "<!--")):
            yield n, line


def test_no_prose_line_is_over_120_characters():
    long = [
        f"{rel(p)}:{n} ({len(line)})"
        for p in SOURCES
        if p not in GENERATED
        for n, line in prose_lines(p)
        if len(line) > 120
    ]
    assert not long, f"prose lines over 120 characters (wrap them): {long}"


def test_the_readme_is_a_short_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 15_000, f"README.md is {len(text.encode())} bytes; the limit is 15,000"
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Set up", "Your model in 10 lines", "Three doors", "Results", "The manual"], headings
    first = [b for b in fenced_blocks(README) if b["lang"] == "bash"][:2]
    assert [b["code"].split()[0] for b in first] == ["./optimize_training.sh", "./run_tests.sh"]
    assert "<!-- flags" not in text, "flag tables live in docs/reference/flags.md"
    visible = re.sub(r"<!--.*?-->", "", text)  # example markers may name the test that runs a block
    assert not re.search(r"\btests/test_\w+\.py", visible), "the README cites no test files"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) == 1 and (ROOT / images[0]).is_file(), images


def heading_ids(path: Path) -> set[str]:
    from markdown.extensions.toc import slugify

    text = "\n".join(line for n, line in prose_lines(path))
    return {slugify(h, "-") for h in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)}


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = ROOT / file
        if not path.exists():
            broken.append(target)
        elif anchor and anchor not in heading_ids(path):
            broken.append(target)
    assert not broken, f"README links to missing files or headings: {broken}"


def readme_block(needle: str) -> str:
    blocks = [b["code"] for b in fenced_blocks(README) if b["lang"] == "python" and needle in b["code"]]
    assert len(blocks) == 1, f"README has {len(blocks)} python blocks with {needle!r}"
    return blocks[0]


@pytest.mark.slow
def test_readme_lightning_module_example(tmp_path):
    pytest.importorskip("lightning")
    code = readme_block("LightningModule")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env_with_repo(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "runs").glob("lit-*/summary.json"))
    assert len(runs) == 1, "the LightningModule run wrote no summary.json"


def test_the_home_page_opens_with_the_readmes_example():
    """docs/index.md shows the README's "Your model in 10 lines" first (test_run_example runs the README's copy)."""
    home = [b for b in fenced_blocks(DOCS / "index.md") if b["lang"] == "python"]
    assert home and home[0]["code"] == readme_block('Task("mine", model'), "docs/index.md's first example differs"
    assert home[0]["marker"] == "tested-by tests/test_docs.py::test_the_home_page_opens_with_the_readmes_example"
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    assert text.index("```python") < text.index("\n## "), "the example comes before the page's first section"


def test_the_layout_page_names_every_engine_module():
    page = (DOCS / "reference" / "layout.md").read_text(encoding="utf-8")
    engine = ROOT / "trainer"
    modules = [p.relative_to(engine).as_posix() for p in sorted(engine.rglob("*.py"))]
    missing = [m for m in modules if not m.endswith("/__init__.py") and f"`{m}`" not in page]
    assert not missing, f"docs/reference/layout.md does not list trainer/ modules {missing}"
