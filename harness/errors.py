"""User-facing errors: each message is one line that names the problem and the fix."""


class ConfigError(ValueError):
    """Bad configuration or input, detected before (or instead of) training."""


class IncompatiblePairing(ConfigError):
    """A scheme × attention cell the variant's declarations refuse; a sweep records it and goes on."""
