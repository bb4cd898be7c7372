"""The measuring tools beside the command line (utils/), re-exported by the package on first use.

utils/ installs with the package as plainloop._app and is not part of a copied trainer/: each tool
is imported when first asked for, so `import plainloop` stays light. `trainer/__init__.py` takes
`app_tool` as its module `__getattr__`.
"""

from __future__ import annotations

import importlib
from typing import Any

PACKAGE = __name__.rsplit(".", 2)[0]  # "plainloop" installed, "trainer" (or a copy's name) here
APP_TOOLS = {
    # Trainer(callbacks=measuring_tools()): monitor, verdict, plots, report
    "measuring_tools": "utils.tools",
    "TrainingMonitor": "utils.performance_monitor",
    "TensorBoardLogger": "utils.tensorboard_logger",
    "plot_run": "utils.plot",  # plot_run(RUN_DIR): a finished run's PNGs (plainloop plot RUN_DIR)
    "diagnose": "utils.bottleneck",  # the measured bottleneck verdict of a run's summary
    "hardware_info": "utils.system_report",  # this machine, as the system report's first part
}


def app_tool(name: str) -> Any:
    """The tool `name` of APP_TOOLS (the package's module `__getattr__`); AttributeError else."""
    if name not in APP_TOOLS:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    try:
        app = importlib.import_module(f"{PACKAGE}._app")
    except ImportError:
        raise AttributeError(
            f"{name} comes with the installed package (pip install plainloop: from plainloop "
            f"import {name}); in plainloop's repository: from {APP_TOOLS[name]} import {name}"
        ) from None
    return getattr(importlib.import_module(app.rename(APP_TOOLS[name])), name)
