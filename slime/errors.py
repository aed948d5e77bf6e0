"""The one exception type for errors a user can cause (bad arguments, files, data).

Its message always names what was wrong and where (argument, file, line), and the CLI
prints it without a traceback.
"""


class SlimeError(Exception):
    """A user-caused error: bad argument, unreadable file, malformed data row, ..."""
