"""Errors that reach the user as one line and a non-zero exit code."""


class UserError(Exception):
    """Bad input or an unmet prerequisite: the CLI prints the message alone and exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
