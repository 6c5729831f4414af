"""``python -m rewind.cli`` runs the CLI (as ``rewind`` and ``python -m rewind`` do)."""

import os

from rewind.cli import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
main()
