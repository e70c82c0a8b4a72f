"""andrea-exp: training-stability experiments for scaled, masked attention."""

__version__ = "0.1.0"
