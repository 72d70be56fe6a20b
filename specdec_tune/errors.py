"""The one exception type for mistakes a user can make; the CLI turns it into exit code 2."""


class SpecDecError(Exception):
    """A user-facing error: the message says what is wrong and what to do."""


class Unsettled(SpecDecError):
    """Too few quiet measurements to stand for this machine: it was too busy (CLI exit code 6)."""


class OtherHardwareError(SpecDecError):
    """A profile was measured on different hardware than this machine (CLI exit code 3)."""


class ContextTooLong(SpecDecError):
    """A context length past what the target was trained for: that length is left out, in one line."""
