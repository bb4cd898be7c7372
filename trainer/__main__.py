"""`python -m plainloop`: the `plainloop` command (training, `plot RUN_DIR`, `hardware`), when installed with it."""

import importlib
import sys

try:  # the command line ships with the installed package, not with a copy of this folder
    app = importlib.import_module(f"{__package__}._app")
except ImportError:
    sys.exit(f"python -m {__package__}: the command line comes with the installed package (pip install plainloop); "
             f"in the repository run python train_optimized.py")  # fmt: skip
sys.exit(app.main())
