"""The one user-facing error type: the CLI prints its message on one line and exits 2."""


class UserError(ValueError):
    """Bad input: the message names the problem and the fix, on one line."""


def first_sentence(e: BaseException, limit: int = 120) -> str:
    """A library exception's first sentence (of its first line, at most ``limit`` characters) for a one-line message;
    the exception's type name when it has no text."""
    text = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    head = text.split(". ")[0].rstrip(".")
    return head if len(head) <= limit else head[: limit - 3] + "..."
