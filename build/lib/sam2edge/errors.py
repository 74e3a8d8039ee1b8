"""The one user-facing error type: the CLI prints its message on one line and exits 2."""


class UserError(ValueError):
    """Bad input: the message names the problem and the fix, on one line."""
