"""andrea-exp: training-stability experiments for scaled, masked attention."""

__version__ = "0.1.0"
# nothing heavy here: the andrea-exp command (andrea_exp.__main__) imports the rest inside its Ctrl-C guard
