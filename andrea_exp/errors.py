"""The error every module raises for a bad setting or bad input data: its message is the one line the user sees.

A module of its own so that the data checks, the schema and the settings validation can all raise it
without importing one another."""


class ConfigError(ValueError):
    """A bad setting; its message is the one line the user sees."""
