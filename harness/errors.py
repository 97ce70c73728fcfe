"""User-facing errors: each message is one line that names the problem and the fix."""


class ConfigError(ValueError):
    """Bad configuration or input, detected before (or instead of) training."""


class IncompatiblePairing(ConfigError):
    """A cell whose options cannot run together: a scheme × attention pairing the variant's declarations refuse,
    or an attention window wider than the sequences it would attend over. A sweep records it and goes on."""


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite: the run is FAILED (``failure=diverged``), and one line says
    at which step and what to change."""
