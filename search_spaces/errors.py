"""The one error type for bad input: the CLI turns it into one line and exit code 2."""


class SpecError(ValueError):
    """Bad user input (unknown model, illegal value, ...). The message names the problem."""
