"""The one error a run reports to its operator (a leaf module: every run module raises it)."""


class RunError(RuntimeError):
    """The run cannot start or had to stop; the message says what to do next."""
