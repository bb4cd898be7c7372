"""torchrun as optimize_training.sh runs it: `python trainer/cli/torchrun.py ARGS` (or `python -m
plainloop.cli.torchrun`) takes torchrun's own arguments.

A stop signal to the agent (SIGTERM from a user, SLURM or `docker stop`) reaches every rank, which writes last.pt
and prints its resume line; torchrun's own main then ended with a traceback and exit 1. Here it ends with one line
and exit 128 + N, as the training process does (docs/guides/cli.md's exit codes). It imports torch only, so it runs
by its path from a Python without plainloop installed.
"""

from __future__ import annotations

import sys
from argparse import Namespace

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.run import get_args_parser, run


def parse(argv: list[str] | None) -> Namespace:
    """torchrun's arguments, its options matched whole: a training flag after the script such as `--n 4` is the
    script's, not an abbreviation of torchrun's `--nnodes`/`--nproc_per_node`."""
    parser = get_args_parser()
    parser.allow_abbrev = False
    return parser.parse_args(argv)


@record
def torchrun_main(argv: list[str] | None) -> None:
    run(parse(argv))


def main(argv: list[str] | None = None) -> int:
    try:
        torchrun_main(argv)
    except SignalException as e:
        print(f"[plainloop] torchrun: stopped by {e.sigval.name}; the ranks said where they stopped", file=sys.stderr)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
