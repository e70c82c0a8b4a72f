"""Settings: the typed schema of every config group (conf/*), the values settings may take, their validation
before any work, the checks of a data source's settings and files, and the errors a bad setting raises.

Owns: schema (the dataclasses Hydra composes into), validation (`validate`, one line per bad setting),
choices (allowed values and normalisers, free of torch), variants (the attention variants' registry: scale
modes, mask fill, QK-LayerNorm, fused-path eligibility; the schema's rules and model/ read it), data_checks
(data.path and token files), errors.

May import: nothing else of andrea_exp (the bottom layer; free of torch, so a sweep's launcher stays light).
"""

from andrea_exp.config import schema as _schema  # noqa: E402,F401  (registers the settings schema with Hydra)
