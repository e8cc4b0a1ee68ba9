"""The error a bad configuration raises, in a module of its own: :mod:`tclock.config` validates
by asking the learners, the mesh and the trackers, and they raise this, so it sits below all of
them (``tclock.config.ConfigError`` is the same class)."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the fix."""
