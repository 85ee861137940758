"""The one error a run reports to its operator (a leaf module: every run module raises it)."""


class RunError(RuntimeError):
    """The run cannot start or had to stop; the message says what to do next."""

    fenced: bool = False  # see FencedRunError


class FencedRunError(RunError):
    """The session ended fenced (its lease could not be renewed): requests to the
    unreachable store may still be in flight, and pyarrow's S3 finalizer would wait for
    each of them (up to storage.s3_retry_max_attempts of backoff) before the process
    exits, so the CLI leaves at once instead (``fenced``)."""

    fenced = True
