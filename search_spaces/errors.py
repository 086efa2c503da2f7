"""The project's errors: one base class, so the CLI can turn any of them into one line.

`MoeAutotuneError` and its subclasses carry a message that names the problem; `orchestrator.commands.cli` prints
it as `error: ...` and exits with the class's `exit_code` (2, bad input, unless a subclass says otherwise).
"""


class MoeAutotuneError(Exception):
    """Something the user can act on; the message names it in one line."""
    exit_code = 2


class SpecError(MoeAutotuneError, ValueError):
    """Bad user input (unknown model, illegal value, a spec field, a flag, ...)."""
