"""Bad-input errors that name the library argument at fault; the command line turns the argument into its flag."""
from __future__ import annotations


class InputError(ValueError):
    """``param`` (a library argument name, e.g. ``seq_len``) has the bad ``value``; ``problem`` says why.

    ``str(err)`` reads ``seq_len=100000: exceeds ...``; :func:`cli_message` reads ``--seq-len 100000: exceeds ...``.
    """

    def __init__(self, param: str, value, problem: str):
        self.param, self.value, self.problem = param, value, problem
        super().__init__(f"{param}={value!r}: {problem}")


def cli_message(err: BaseException, flags: dict[str, str] | None = None) -> str:
    """The one-line message the CLI prints: an :class:`InputError` names the flag (``--`` + the argument with
    dashes, or ``flags[param]``); anything else is printed as it is."""
    if isinstance(err, InputError):
        flag = (flags or {}).get(err.param, "--" + err.param.replace("_", "-"))
        return f"{flag} {err.value}: {err.problem}"
    return str(err)
