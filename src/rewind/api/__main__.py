"""``python -m rewind.api serve|verify``: the server without the Typer CLI."""

import sys

from rewind.api.command import main

sys.exit(main())
