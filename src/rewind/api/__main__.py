"""``python -m rewind.api serve|verify [options]``: the same as ``rewind serve [options]`` and
``rewind verify --server [options]`` (the Typer commands in :mod:`rewind.cli.serve` and
:mod:`rewind.cli.record`), kept for scripts that start the server this way."""

import sys

from rewind.cli import main

args = sys.argv[1:]
if args[:1] == ["verify"]:
    args = ["verify", "--server", *args[1:]]
sys.argv = [sys.argv[0], *args]
main()
