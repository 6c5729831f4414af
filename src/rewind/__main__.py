"""``python -m rewind`` runs the CLI."""

from rewind.cli import main

main()
