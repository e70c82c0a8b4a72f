"""andrea-exp: training-stability experiments for scaled, masked attention."""

__version__ = "0.1.0"

from andrea_exp.config import schema as _schema  # noqa: E402,F401  (registers the settings schema with Hydra)
