"""What `pip install .` installs; the project's metadata is in pyproject.toml.

- the engine folder `trainer/` installs as the package `plainloop` (it uses relative imports only), with every
  subfolder;
- the command line and its built-in tasks install under `plainloop._app`: train_optimized.py and the folders
  tasks/, datasets/, models/ and utils/, beside scripts/app/__init__.py, the `plainloop` command. They import each
  other by those plain names, which only the command's own process makes importable, so `import plainloop` never
  shadows a user's `datasets` or `utils`.

Nothing installs under a top-level name other than `plainloop`. The repository itself runs unchanged.
"""

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

APP_FOLDERS = ("tasks", "datasets", "models", "utils")


def subpackages(folder: str, name: str) -> list[str]:
    """`name` and a `name.x` for every folder below `folder` holding Python code (an __init__.py is optional)."""
    found = find_namespace_packages(folder, exclude=["*__pycache__*"])
    return [name] + [f"{name}.{sub}" for sub in found]


package_dir = {"plainloop": "trainer", "plainloop._app": "scripts/app"}
packages = subpackages("trainer", "plainloop") + ["plainloop._app"]
for folder in APP_FOLDERS:
    package_dir[f"plainloop._app.{folder}"] = folder
    packages += subpackages(folder, f"plainloop._app.{folder}")


class BuildPy(build_py):
    """train_optimized.py, at the repository's root, installs as plainloop/_app/train_optimized.py (the command
    runs it from there; under `pip install -e` it runs the repository's own)."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        found = super().find_package_modules(package, package_dir)
        return found + [(package, "train_optimized", "train_optimized.py")] if package == "plainloop._app" else found


# py.typed: the engine's annotations reach a user's mypy (PEP 561)
setup(
    package_dir=package_dir, packages=packages, package_data={"plainloop": ["py.typed"]}, cmdclass={"build_py": BuildPy}
)
