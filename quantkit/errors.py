"""One exception family for problems a user can fix.

The CLI prints a QuantkitError as a single line (what went wrong, where, and the fix) and exits 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class QuantkitError(Exception):
    """A user-fixable problem: bad path, bad file, bad option, unsupported model."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message
