"""Checks every setting before any expensive work, with one line that names it and what is allowed."""

from __future__ import annotations

import contextlib
import difflib
import io
import math
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from andrea_exp.attention import normalize_mask_fill, normalize_scale
from andrea_exp.model import ATTN_IMPLS, QK_INITS

LOGGER_MODES = ("auto", "online", "offline", "disabled")
DATA_SOURCES = ("markov", "text")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PROGRESS = ("auto", True, False)
_ABSENT = object()


class ConfigError(ValueError):
    """A bad setting; its message is the one line the user sees."""


def _positive_int(cfg, key: str, minimum: int = 1) -> None:
    value = cfg_get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}; got {value!r}")


def _finite(cfg, key: str, low: float | None = None, low_inclusive=True, high: float | None = None) -> None:
    value = cfg_get(cfg, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>=' if low_inclusive else '>'} {low:g}")
        if high is not None:
            bounds.append(f"<= {high:g}")
        raise ConfigError(f"{key} must be a finite number {' and '.join(bounds)}; got {value!r}".replace("  ", " "))


def _choice(cfg, key: str, allowed) -> None:
    value = cfg_get(cfg, key)
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def cfg_get(cfg, dotted: str):
    """The value at a dotted key; a missing key or a `???` value is a ConfigError naming it."""
    value = OmegaConf.select(cfg, dotted, default=_ABSENT, throw_on_missing=False)
    if value is _ABSENT:
        raise ConfigError(f"{dotted} must be set; it is missing or ??? in the composed config")
    return value


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError on the first bad setting."""
    for key in ("model.d_model", "model.n_layer", "model.n_head", "model.d_k", "model.d_v", "model.block_size",
                "model.mlp_ratio", "data.seq_len", "train.batch_size", "data.train_sequences", "data.eval_sequences"):
        _positive_int(cfg, key)
    for key in ("train.max_steps", "train.warmup_steps", "train.eval_every", "train.ckpt_every", "probe.every",
                "probe.maps_every", "train.sample_tokens", "seed"):
        _positive_int(cfg, key, minimum=0)
    _positive_int(cfg, "train.log_every")
    _positive_int(cfg, "probe.maps_heads")
    _positive_int(cfg, "train.diverge_patience")
    _positive_int(cfg, "probe.batch_size")
    _finite(cfg, "train.lr", low=0, low_inclusive=False)
    _finite(cfg, "train.min_lr_ratio", low=0, high=1)
    _finite(cfg, "train.weight_decay", low=0)
    _finite(cfg, "train.grad_clip", low=0)
    _finite(cfg, "train.diverge_factor", low=1, low_inclusive=False)
    _finite(cfg, "model.dropout", low=0, high=1)
    for key in ("train.beta1", "train.beta2"):
        _finite(cfg, key, low=0, high=0.999999)
    try:
        normalize_scale(cfg.model.scale)
        normalize_mask_fill(cfg.model.mask_fill)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _choice(cfg, "model.qk_init", QK_INITS)
    _choice(cfg, "model.attn_impl", ATTN_IMPLS)
    _choice(cfg, "model.causal", (True, False))
    _choice(cfg, "model.qk_layernorm", (True, False))
    _choice(cfg, "train.precision", PRECISIONS)
    _choice(cfg, "train.resume", (True, False))
    _choice(cfg, "train.compile", (True, False))
    _choice(cfg, "train.progress", PROGRESS)
    _choice(cfg, "probe.per_head", (True, False))
    _choice(cfg, "logger.mode", LOGGER_MODES)
    _choice(cfg, "data.name", DATA_SOURCES)
    device = str(cfg.train.device)
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise ConfigError(f"train.device must be auto, cpu, cuda or cuda:N; got {device!r}")
    if cfg.data.train_sequences < cfg.train.batch_size:
        raise ConfigError(f"data.train_sequences ({cfg.data.train_sequences}) must be >= train.batch_size "
                          f"({cfg.train.batch_size})")
    if cfg.data.seq_len > cfg.model.block_size:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) must be <= model.block_size ({cfg.model.block_size})")
    if cfg.data.name == "markov":
        for key in ("data.vocab_size", "data.order", "data.branching"):
            _positive_int(cfg, key)
        _positive_int(cfg, "data.table_seed", minimum=0)
        _finite(cfg, "data.concentration", low=0, low_inclusive=False)
        if cfg.data.vocab_size ** cfg.data.order > 2_000_000:
            raise ConfigError("data.vocab_size ** data.order must be at most 2,000,000 contexts; "
                              f"got {cfg.data.vocab_size}**{cfg.data.order}")
    else:
        path = None if OmegaConf.is_missing(cfg.data, "path") else cfg.data.get("path")
        if path in (None, "", "???"):
            raise ConfigError("data.path must name a text file when data=text; got nothing")
        file = Path(str(path)).expanduser()
        if not file.exists():
            raise ConfigError(f"data.path must name an existing text file; {str(file)!r} does not exist")
        if not file.is_file():
            raise ConfigError(f"data.path must name a text file; {str(file)!r} is not a file")
        if file.stat().st_size < 2 * (cfg.data.seq_len + 2):
            raise ConfigError(f"data.path must hold at least {2 * (cfg.data.seq_len + 2)} bytes for "
                              f"data.seq_len={cfg.data.seq_len}; {str(file)!r} has {file.stat().st_size}")
    vocab = cfg.model.get("vocab_size")
    if vocab is not None:
        _positive_int(cfg, "model.vocab_size")
        data_vocab = cfg.data.vocab_size if cfg.data.name == "markov" else 256
        if vocab < data_vocab:
            raise ConfigError(f"model.vocab_size must be null or >= the data's {data_vocab} tokens; got {vocab}")


def validate_device(cfg: DictConfig) -> None:
    """train.device names a device this machine has. Single runs only: a sweep's launcher picks the GPU."""
    import torch

    device = str(cfg.train.device)
    if device.startswith("cuda"):
        count = torch.cuda.device_count()
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= count:
            seen = f"{count} CUDA device{'s' if count != 1 else ''}"
            raise ConfigError(f"train.device must be auto, cpu or a visible GPU; got {device!r} and {seen} visible")


# ------------------------------------------------------------------ the command line

_SHOWN_BY_HYDRA = ("Set the environment variable HYDRA_FULL_ERROR", "To append to your config use", "See https://")


def command_line_error(argv: list[str], config_dir: Path, config_name: str = "config") -> str | None:
    """One line for a command line Hydra would reject, or whose single run has a bad setting; None when fine.

    Hydra reports an unknown key or group option in several lines; this names the setting and what is
    allowed. Every value of a sweep is composed once (not every combination). Flags other than -m are
    left to Hydra.
    """
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    overrides = [arg for arg in argv if arg not in ("-m", "--multirun")]
    if any(arg.startswith("-") for arg in overrides):
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    parser = OverridesParser.create()
    fixed, swept = [], []
    for line in overrides:
        try:
            (parsed,) = parser.parse_overrides([line])
        except OverrideParseException as err:
            return (f"cannot read the override {line!r}: {_first_line(err)} "
                    "(grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)")
        if not parsed.is_sweep_override():
            fixed.append(line)
        elif parsed.is_discrete_sweep():
            swept.append([f"{parsed.get_key_element()}={value}" for value in parsed.sweep_string_iterator()])
        # other sweeps (intervals) are a sweeper plugin's parameters, not settings of one run
    firsts = [values[0] for values in swept]
    cells = [fixed + firsts]
    for i, values in enumerate(swept):
        cells += [fixed + firsts[:i] + [value] + firsts[i + 1:] for value in values[1:]]

    with contextlib.redirect_stderr(io.StringIO()), initialize_config_dir(str(config_dir), version_base="1.3"):
        for cell in cells:
            try:
                cfg = compose(config_name, overrides=cell)
            except MissingConfigException as err:
                return _missing_choice(err)
            except (HydraException, OmegaConfBaseException) as err:
                return _composition_error(err, cell, lambda rest: compose(config_name, overrides=rest,
                                                                           return_hydra_config=True))
    if not multirun:  # a sweep records a bad cell as failed and goes on with the others
        try:
            validate(cfg)
            validate_device(cfg)
        except ConfigError as err:
            return str(err)
    return None


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _missing_choice(err) -> str:
    found = re.search(r"Could not find '([^']+)'", str(err))
    if not found or "/" not in found.group(1) or not err.options:
        return _first_line(err)
    group, choice = found.group(1).rsplit("/", 1)
    return f"{group}={choice} is not an option; {group} must be one of {', '.join(sorted(err.options))}"


def _composition_error(err: Exception, cell: list[str], compose_without) -> str:
    """Name the unknown key and the keys that exist beside it; otherwise Hydra's message in one line."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    found = re.search(r"Could not override '([^']+)'", str(err))
    if found and isinstance(err.__cause__, (ConfigAttributeError, ConfigKeyError)):
        key = found.group(1)
        rest = [line for line in cell if not line.lstrip("+~").startswith(key + "=")]
        try:
            base = compose_without(rest)
        except Exception:  # another bad override among the rest: the key alone is still worth naming
            return f"{key} is not a setting"
        parent, _, leaf = key.rpartition(".")
        while parent and not isinstance(OmegaConf.select(base, parent, default=None), DictConfig):
            parent, _, leaf = parent.rpartition(".")  # climb to the deepest part that exists
        node = OmegaConf.select(base, parent) if parent else base
        names = [name for name in node if parent or name != "hydra"]
        where = f"{parent}." if parent else ""
        close = difflib.get_close_matches(leaf, names, n=1)
        hint = f"did you mean {where}{close[0]}? " if close else ""
        return f"{key} is not a setting; {hint}{parent or 'the top level'} has: {', '.join(names)}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and not line.startswith(_SHOWN_BY_HYDRA)]
    if err.__cause__ is not None and isinstance(err.__cause__, Exception):
        lines.append(_first_line(err.__cause__))
    return " ".join(dict.fromkeys(lines)) or type(err).__name__
