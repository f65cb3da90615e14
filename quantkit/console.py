"""The consoles every command prints to: results on stdout, errors and warnings on stderr."""

import sys

from rich.console import Console

# Piped into a CI log or a file, rich would assume 80 columns and squeeze the result tables unreadably.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)
