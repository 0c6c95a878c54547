"""The one exception type the CLI turns into a one-line `error: ...` message."""


class CompileError(Exception):
    """A problem with the user's model, options or target, stated in one line."""
