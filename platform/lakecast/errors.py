"""Errors that Lakecast raises with a message naming the fix."""


class LakecastError(Exception):
    """Base class of Lakecast's own errors."""


class SetupError(LakecastError):
    """The environment is missing something (Java, Delta JARs); the message names the fix."""


class ConfigError(LakecastError):
    """A setting is invalid."""
