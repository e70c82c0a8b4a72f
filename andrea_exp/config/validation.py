"""Checks every setting before any expensive work, with one line that names it and what is allowed."""

from __future__ import annotations

import contextlib
import difflib
import functools
import io
import math
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from andrea_exp.config import schema
from andrea_exp.config.data_checks import check_data, check_markov_contexts, token_vocab_size
from andrea_exp.config.errors import ConfigError  # noqa: F401  (re-exported: the error every module raises)
from andrea_exp.config.variants import check_with_training

_ABSENT = object()
_WARMUP_DEFAULT_FILE = "train/default.yaml"


def cfg_get(cfg, dotted: str):
    """The value at a dotted key; a missing key or a `???` value is a ConfigError naming it."""
    value = OmegaConf.select(cfg, dotted, default=_ABSENT, throw_on_missing=False)
    if value is _ABSENT:
        raise ConfigError(f"{dotted} must be set; it is missing or ??? in the composed config")
    return value


FP16_REFUSED = ("train.precision=fp16 is refused: float16 autocast needs loss scaling, which this loop does not "
                "do; use bf16 (same speed on Ampere and later GPUs) or fp32")


def validate(cfg: DictConfig) -> schema.Config:
    """Raise ConfigError on the first bad setting: unknown keys, each field's rule, then rules across fields.
    Returns the settings as their dataclasses (schema.Config), checked: what the run reads from then on."""
    _refuse_unknown_keys(cfg)
    schema.SETTINGS["data.name"].metadata["rule"].check("data.name", cfg_get(cfg, "data.name"))
    source = cfg.data.name
    for key in schema.SETTINGS:
        if key.startswith("model."):
            cfg_get(cfg, key)  # set: ModelSchema checks the values itself, as a library caller's are
    model = schema.ModelSchema(**_values(cfg.model))  # each field's rule and the variant's rules across fields
    for key, spec in schema.SETTINGS.items():
        if key.startswith("model."):
            continue
        sources = spec.metadata["sources"]
        if sources is not None:
            value = None if OmegaConf.is_missing(cfg, key) else OmegaConf.select(cfg, key)
            if source not in sources:
                if value is not None:
                    readers = " or ".join(f"data={s}" for s in sources)
                    raise ConfigError(f"{key} is read only by {readers}; got {key}={value!r} with data={source}")
                continue
            if value is None and (key == "data.path" or (key == "data.vocab_size" and source == "tokens")):
                continue  # the disk checks below say what is wanted (data=tokens: null reads meta.json)
            spec.metadata["rule"].check(key, value)  # a source that reads it needs a value
        else:
            schema.check_value(key, spec, cfg_get(cfg, key))
    groups = {name: kind(**_values(cfg[name])) for name, kind in schema.GROUP_TYPES.items() if name != "model"}
    top = {key: cfg[key] for key in schema.SETTINGS if "." not in key}
    settings = schema.Config(model=model, **groups, **top)
    _check_across_fields(settings, source)
    return settings


def _values(node) -> dict:
    """A group's values as plain Python (interpolations resolved), for its dataclass."""
    return OmegaConf.to_container(node, resolve=True)


def _check_across_fields(cfg: schema.Config, source: str) -> None:
    if cfg.train.precision == "fp16":
        raise ConfigError(FP16_REFUSED)
    if cfg.data.train_sequences is not None and cfg.data.train_sequences < cfg.train.batch_size:
        raise ConfigError(f"data.train_sequences ({cfg.data.train_sequences}) must be >= train.batch_size "
                          f"({cfg.train.batch_size})")
    if cfg.data.seq_len > cfg.model.block_size:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) must be <= model.block_size ({cfg.model.block_size})")
    _check_warmup(cfg.train)
    check_with_training(cfg.model, cfg.train.attn_stats)
    if source == "markov":
        check_markov_contexts(cfg.data.vocab_size, cfg.data.order)
    if source in ("text", "tokens"):
        check_data(cfg.data, cfg.data.seq_len)
    vocab = cfg.model.vocab_size
    data_vocab = 256 if source == "text" else token_vocab_size(cfg.data)  # data=tokens: null reads meta.json
    if vocab is not None and vocab < data_vocab:
        raise ConfigError(f"model.vocab_size must be null or >= the data's {data_vocab} tokens; got {vocab}")


_CHECKED: dict[str, schema.Config] = {}  # a single run's settings, validated before Hydra started it


def checked(cfg: DictConfig) -> schema.Config:
    """validate(cfg) for a Hydra job: a single run's settings were validated from the command line before Hydra
    made its directory (command_line_error), so the same composed settings are taken as they were checked."""
    settings = _CHECKED.pop(_settings_key(cfg), None)
    return validate(cfg) if settings is None else settings


def _settings_key(cfg: DictConfig) -> str:
    """The composed settings as text, without Hydra's own node (which the job's config leaves out)."""
    values = OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra", None)
    return repr(values)


@functools.cache
def _shipped_warmup():
    """warmup_steps of conf/train/default.yaml, read once: a sweep validates every value of every axis."""
    return OmegaConf.load(schema.CONF_DIR / _WARMUP_DEFAULT_FILE).get("warmup_steps")


def _check_warmup(train) -> None:
    """A warmup longer than the run never reaches train.lr. The shipped default (50 steps) is left alone so
    that short smoke runs (train.max_steps=5) work; a warmup someone chose is held to the run's length."""
    default = _shipped_warmup()
    if train.max_steps > 0 and train.warmup_steps > train.max_steps and train.warmup_steps != default:
        raise ConfigError(f"train.warmup_steps ({train.warmup_steps}) must be <= train.max_steps "
                          f"({train.max_steps}): the learning rate would never reach train.lr")


def _refuse_unknown_keys(cfg: DictConfig) -> None:
    """A key the schema lacks (Hydra lets `+group.key=...` add one) is a typo or a setting nobody reads."""
    for name in cfg:
        if name == "hydra":
            continue
        if name in schema.GROUPS:
            node = cfg[name]
            if isinstance(node, DictConfig):
                for leaf in node:
                    if f"{name}.{leaf}" not in schema.SETTINGS:
                        raise ConfigError(not_a_setting(f"{name}.{leaf}", cfg))
        elif name not in schema.SETTINGS:
            raise ConfigError(not_a_setting(str(name), cfg))


def not_a_setting(key: str, cfg: DictConfig) -> str:
    """`KEY is not a setting; did you mean ...? GROUP has: ...` against the settings the schema knows."""
    parent, _, leaf = key.rpartition(".")
    while parent and not isinstance(OmegaConf.select(cfg, parent, default=None), DictConfig):
        parent, _, leaf = parent.rpartition(".")  # climb to the deepest part that exists
    node = OmegaConf.select(cfg, parent) if parent else cfg
    known = set(schema.SETTINGS) | set(schema.GROUPS) if parent in schema.GROUPS or not parent else None
    where = f"{parent}." if parent else ""
    names = [name for name in node if (parent or name != "hydra") and (known is None or f"{where}{name}" in known)]
    if not names and parent:  # a dict that starts empty (hydra.launcher.additional_parameters): Hydra's own hint
        return f"{key} is not a setting; {parent} starts empty: add a key to it with +{key}=VALUE"
    close = difflib.get_close_matches(leaf, names, n=1)
    hint = f"did you mean {where}{close[0]}? " if close else ""
    return f"{key} is not a setting; {hint}{parent or 'the top level'} has: {', '.join(names)}"


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
    """One line for a command line Hydra would reject, or with a bad setting in any run it starts; None when fine.

    Hydra reports an unknown key or group option in several lines; this names the setting and what is
    allowed. A sweep is checked before its first cell runs: every value of every axis (the command line's
    and an experiment's hydra.sweeper.params) is composed once with the other axes' first values and
    validated, so a bad value is named before any work (not every combination). Flags other than -m are
    left to Hydra.
    """
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    overrides = [arg for arg in argv if arg not in ("-m", "--multirun")]
    if any(arg.startswith("-") for arg in overrides):
        return None
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    with contextlib.redirect_stderr(io.StringIO()), initialize_config_dir(str(config_dir), version_base="1.3"):
        compose_cell = lambda cell, hydra=False: compose(config_name, overrides=cell, return_hydra_config=hydra)
        try:
            fixed, axes = _split_sweep(overrides)
            if axes and not multirun:
                return sweep_needs_m(axes, argv)
            if multirun:
                axes += _experiment_axes(compose_cell(fixed, hydra=True), fixed, axes)
        except _OverrideError as err:
            return str(err)
        except MissingConfigException as err:
            return _missing_choice(err)
        except (HydraException, OmegaConfBaseException) as err:
            return _composition_error(err, fixed, lambda rest: compose_cell(rest, hydra=True))
        for cell, swept in _cells(fixed, axes):
            where = f" (sweep value {swept})" if swept else ""
            try:
                cfg = compose_cell(cell, hydra=not multirun)  # a single run: hydra.sweeper.params, read below
            except MissingConfigException as err:
                return _missing_choice(err)
            except (HydraException, OmegaConfBaseException) as err:
                return _composition_error(err, cell, lambda rest: compose_cell(rest, hydra=True))
            try:
                settings = validate(cfg)
                if not multirun:  # a sweep's launcher picks each cell's GPU
                    validate_device(cfg)
                    _CHECKED[_settings_key(cfg)] = settings  # the run Hydra starts next has these settings
            except ConfigError as err:
                return f"{err}{where}"
            if not multirun:
                return sweep_without_m(cfg, fixed, argv)
    return None


def sweep_without_m(hydra_cfg: DictConfig, fixed: list[str], argv: list[str]) -> str | None:
    """One line for a sweep preset (an experiment with hydra.sweeper.params) run without -m, which Hydra would
    run as one cell of its grid without a word; None when the command line gives every swept setting one value."""
    import shlex

    open_axes = [axis for axis in _experiment_axes(hydra_cfg, fixed, []) if len(axis) > 1]
    if not open_axes:
        return None
    runs = math.prod(len(axis) for axis in open_axes)
    keys = ", ".join(axis[0].split("=", 1)[0] for axis in open_axes)
    preset = next((line for line in fixed if line.lstrip("+~").startswith("experiment=")), "the experiment")
    return (f"{preset} is a sweep of {runs} runs over {keys}; run it with -m: andrea-exp -m {shlex.join(argv)} "
            "(or give each of those settings one value to train a single run)")


def sweep_needs_m(axes: list[list[str]], argv: list[str]) -> str:
    """One line for values swept without -m (Hydra says it in four lines): the command with -m."""
    import shlex

    swept = ", ".join(f"{axis[0].split('=', 1)[0]} ({len(axis)} values)" for axis in axes)
    return f"values separated by commas are a sweep ({swept}); run it with -m: andrea-exp -m {shlex.join(argv)}"


class _OverrideError(ValueError):
    pass


def _split_sweep(overrides: list[str]) -> tuple[list[str], list[list[str]]]:
    """The fixed overrides, and each discrete sweep axis as its list of `key=value` overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    fixed, axes = [], []
    for line in overrides:
        try:
            (parsed,) = parser.parse_overrides([line])
        except OverrideParseException as err:
            raise _OverrideError(f"cannot read the override {line!r}: {_first_line(err)} "
                                 "(grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)") from None
        if not parsed.is_sweep_override():
            fixed.append(line)
        elif parsed.is_discrete_sweep():
            axes.append([f"{parsed.get_key_element()}={value}" for value in parsed.sweep_string_iterator()])
        # other sweeps (intervals) are a sweeper plugin's parameters, not settings of one run
    return fixed, axes


def _experiment_axes(hydra_cfg: DictConfig, fixed: list[str], axes: list[list[str]]) -> list[list[str]]:
    """hydra.sweeper.params (an experiment's grid) as axes; a key the command line sets itself wins."""
    params = OmegaConf.select(hydra_cfg, "hydra.sweeper.params", default=None) or {}
    given = {line.split("=", 1)[0].lstrip("+~") for line in fixed} | {axis[0].split("=", 1)[0] for axis in axes}
    lines = [f"{key}={value}" for key, value in params.items() if key not in given]
    return _split_sweep(lines)[1] + [[line] for line in _split_sweep(lines)[0]]


def _cells(fixed: list[str], axes: list[list[str]]):
    """(overrides, the swept value that made the cell or None): all first values, then each other value once."""
    firsts = [values[0] for values in axes]
    yield fixed + firsts, None
    for i, values in enumerate(axes):
        for value in values[1:]:
            yield fixed + firsts[:i] + [value] + firsts[i + 1:], value


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
    """Name the unknown key and the keys that exist beside it, or the rule a typed value broke; otherwise
    Hydra's message in one line."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = err.__cause__
    key = getattr(cause, "full_key", None)
    if isinstance(cause, ValidationError) and key in schema.SETTINGS:
        try:  # the schema's type refused the value: say what the rule allows
            schema.SETTINGS[key].metadata["rule"].check(key, cause.value)
        except ConfigError as rule_error:
            return str(rule_error)
    found = re.search(r"Could not override '([^']+)'", str(err))
    if found and isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        key = found.group(1)
        rest = [line for line in cell if not line.lstrip("+~").startswith(key + "=")]
        try:
            base = compose_without(rest)
        except Exception:  # another bad override among the rest: the key alone is still worth naming
            return f"{key} is not a setting"
        return not_a_setting(key, base)
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and not line.startswith(_SHOWN_BY_HYDRA)]
    if cause is not None and isinstance(cause, Exception):
        lines.append(_first_line(cause))
    return " ".join(dict.fromkeys(lines)) or type(err).__name__
