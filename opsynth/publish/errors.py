"""The one error type of publishing: a single line saying what went wrong and what to do."""


class PublishError(RuntimeError):
    """Printed by the CLI as one line (exit code 2); never carries the token."""
