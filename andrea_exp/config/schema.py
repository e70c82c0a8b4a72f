"""The settings' schema: one typed dataclass per config group, registered in Hydra's ConfigStore.

conf/config.yaml starts its defaults list with `base_config` (the `Config` below), so every yaml file
in conf/ extends this schema: a key the schema lacks, or a value of the wrong type, is refused when
Hydra composes. The yaml files hold the values; this module holds, beside each field, its type, the
rule its value must follow (`rule`), whether it can change what a run measures (`operational`) and,
for data settings, which data sources read it (`sources`). validate(), is_scientific() and
SCIENTIFIC_KEYS are derived from it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from andrea_exp.config import variants
from andrea_exp.config.errors import ConfigError  # noqa: F401  (re-exported: raised by the rules below)
from andrea_exp.config.variants import (
    ATTN_IMPLS,
    QK_INITS,
    QK_LAYERNORM,
    SDPA_BACKEND_NAMES,
    check_variant,
    normalize_mask_fill,
    normalize_scale,
)


def find_conf_dir(package_dir: Path) -> Path:
    """The configs shipped inside the package (an installed wheel) or, in a checkout, the top-level conf/."""
    for candidate in (package_dir / "conf", package_dir.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    return package_dir.parent / "conf"  # Hydra then names the missing directory


CONF_DIR = find_conf_dir(Path(__file__).resolve().parent.parent)

LOGGER_MODES = ("auto", "online", "offline", "disabled")
DATA_SOURCES = ("markov", "text", "tokens")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PROGRESS = ("auto", True, False)
BOOLS = (True, False)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
LOSS_IMPLS = ("chunked", "plain")
ATTN_STATS_CHOICES = ("every", "off")  # `train.attn_stats`
ATTN_STATS_PASSES = ("auto", "fused", "separate")  # `train.attn_stats_pass`


def normalize_attn_stats(value) -> str:
    """`train.attn_stats` as every | off, however YAML read it: a bare `off` is false and `on` true there, so
    `attn_stats: off` and `attn_stats: "off"` mean the same."""
    if isinstance(value, bool):
        return "every" if value else "off"
    if value not in ATTN_STATS_CHOICES:
        raise ValueError(f"train.attn_stats must be one of {', '.join(ATTN_STATS_CHOICES)}; got {value!r}")
    return value


# ------------------------------------------------------------------ rules: each says what is allowed in one line


@dataclass(frozen=True)
class Integer:
    minimum: int = 0

    def check(self, key: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise ConfigError(f"{key} must be an integer >= {self.minimum}; got {value!r}")


@dataclass(frozen=True)
class Finite:
    low: float | None = None
    low_inclusive: bool = True
    high: float | None = None

    def check(self, key: str, value) -> None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok and self.low is not None:
            ok = value >= self.low if self.low_inclusive else value > self.low
        if ok and self.high is not None:
            ok = value <= self.high
        if not ok:
            bounds = []
            if self.low is not None:
                bounds.append(f"{'>=' if self.low_inclusive else '>'} {self.low:g}")
            if self.high is not None:
                bounds.append(f"<= {self.high:g}")
            raise ConfigError(f"{key} must be a finite number {' and '.join(bounds)}; got {value!r}".replace("  ", " "))


@dataclass(frozen=True)
class Choice:
    allowed: tuple
    shown: tuple | None = None  # how the message spells the allowed values (default: str of each)

    def check(self, key: str, value) -> None:
        # 1 == True in Python: a bool choice must not accept the integer 1
        if value not in self.allowed or (isinstance(value, int) and not isinstance(value, bool)
                                         and any(isinstance(a, bool) for a in self.allowed)):
            raise ConfigError(f"{key} must be one of {', '.join(map(str, self.shown or self.allowed))}; "
                              f"got {value!r}")


@dataclass(frozen=True)
class Normalized:
    """Accepted when `normalize(value)` accepts it; its ValueError is already the one line."""
    normalize: Any

    def check(self, key: str, value) -> None:
        try:
            self.normalize(value)
        except ValueError as err:
            raise ConfigError(str(err)) from None


class Device:
    def check(self, key: str, value) -> None:
        device = str(value)
        if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
            raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N; got {device!r}")


class Text:
    def check(self, key: str, value) -> None:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string; got {value!r}")


class TextList:
    def check(self, key: str, value) -> None:
        if not isinstance(value, (list, tuple, ListConfig)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key} must be a list of strings; got {value!r}")


def setting(rule, default=MISSING, *, operational: bool = False, optional: bool = False,
            sources: tuple[str, ...] | None = None):
    """A schema field; its value comes from the yaml files in conf/, else `default` (MISSING: a yaml must set it).

    optional: null is allowed (and skips the rule). sources: the data sources that read it; for the
    others it must stay null.
    """
    if default is MISSING and (optional or sources):
        default = None
    return field(default=default,
                 metadata={"rule": rule, "operational": operational, "optional": optional or bool(sources),
                           "sources": sources})


def check_value(key: str, spec: dataclasses.Field, value) -> None:
    """One setting against its field's rule (null passes where the field is optional)."""
    if value is None and spec.metadata["optional"]:
        return
    spec.metadata["rule"].check(key, value)


def check_group(instance, group: str) -> None:
    """Every field of a group's dataclass instance against its rule, in the schema's order."""
    for spec in dataclasses.fields(instance):
        check_value(f"{group}.{spec.name}", spec, getattr(instance, spec.name))


# ------------------------------------------------------------------ the schema, one dataclass per group


@dataclass
class ModelSchema:
    """The model's settings, and the config `model.decoder.Andrea` is built from (`OmegaConf.to_object(cfg.model)`,
    or ModelSchema(...) directly: every rule below is checked on construction, so a direct caller is refused
    the same way validate() refuses a composed config). The defaults serve direct callers and settings a
    preset leaves out; the presets in conf/model/ set them all."""
    name: str = setting(Text(), "andrea", operational=True)  # a preset's label; its fields carry the science
    d_model: int = setting(Integer(1), 128)
    n_layer: int = setting(Integer(1), 2)
    n_head: int = setting(Integer(1), 4)
    d_k: int = setting(Integer(1), 32)
    d_v: int = setting(Integer(1), 32)
    block_size: int = setting(Integer(1), 128)
    # the attention variant (config/variants.py holds each setting's values and what they compute)
    scale: Any = setting(Normalized(normalize_scale), "sqrt")  # "sqrt" / "none" / "inv" / true / false
    causal: bool = setting(Choice(BOOLS), True)
    mask_fill: Any = setting(Normalized(normalize_mask_fill), "-inf")  # "-inf" or a number
    qk_init: str = setting(Choice(QK_INITS), "unit")
    qk_layernorm: bool = setting(Choice(QK_LAYERNORM), False)
    logit_softcap: float | None = setting(Finite(low=0, low_inclusive=False), optional=True)  # cap*tanh(s/cap)
    sigma_reparam: bool = setting(Choice(BOOLS, shown=("true", "false")), False)  # W_q, W_k as gamma/sigma(W) W
    attn_impl: str = setting(Choice(ATTN_IMPLS), "auto")
    mlp_ratio: int = setting(Integer(1), 4)
    dropout: float = setting(Finite(low=0, high=1), 0.0)
    vocab_size: int | None = setting(Integer(1), optional=True)  # null: the data's
    # how the same model is computed, not what it is: kernels and fusions that leave the results unchanged
    sdpa_backend: str = setting(Choice(("auto", *SDPA_BACKEND_NAMES)), "auto", operational=True)
    fused_qkv: bool = setting(Choice(BOOLS, shown=("true", "false")), True, operational=True)
    loss_impl: str = setting(Choice(LOSS_IMPLS), "chunked", operational=True)
    loss_chunk_rows: int = setting(Integer(1), 4096, operational=True)
    # a library caller's choice, not a run setting (runs always tie the head to the token table): no config key
    tie_embeddings: InitVar[bool] = True

    def __post_init__(self, tie_embeddings: bool) -> None:
        self.tie_embeddings = tie_embeddings
        check_group(self, "model")
        check_variant(self)

    # derived from the fields above (variants.py holds the rules), so every reader takes the same value
    @property
    def attn_path(self) -> str:
        """`attn_impl` resolved: fused | explicit | bilinear (variants.resolve_attn_impl)."""
        return variants.resolve_attn_impl(self)

    @property
    def scale_factor(self) -> float:
        """The multiplier applied to q.k: 1/sqrt(d_k), 1 or 1/d_k (variants.scale_factor)."""
        return variants.scale_factor(self.scale, self.d_k)


@dataclass
class DataSchema:
    """One schema for every source; a source-specific field is null for the sources that do not read it."""
    name: str = setting(Choice(DATA_SOURCES))
    seq_len: int = setting(Integer(1))
    train_sequences: int | None = setting(Integer(1), optional=True)  # null (data=tokens): every window
    eval_sequences: int = setting(Integer(1))
    vocab_size: int | None = setting(Integer(2), sources=("markov", "text", "tokens"))  # one token: nothing to learn
    order: int | None = setting(Integer(1), sources=("markov",))
    branching: int | None = setting(Integer(1), sources=("markov",))
    concentration: float | None = setting(Finite(low=0, low_inclusive=False), sources=("markov",))
    table_seed: int | None = setting(Integer(0), sources=("markov",))
    path: str | None = setting(Text(), sources=("text", "tokens"))  # checked against the disk by config.validate


@dataclass
class TrainSchema:
    max_steps: int = setting(Integer(0))
    batch_size: int = setting(Integer(1))
    lr: float = setting(Finite(low=0, low_inclusive=False))
    min_lr_ratio: float = setting(Finite(low=0, high=1))
    warmup_steps: int = setting(Integer(0))
    weight_decay: float = setting(Finite(low=0))
    beta1: float = setting(Finite(low=0, high=0.999999))
    beta2: float = setting(Finite(low=0, high=0.999999))
    grad_clip: float = setting(Finite(low=0))
    z_loss: float = setting(Finite(low=0), 0.0)  # coefficient of mean log Z^2 of the output logits (0: none)
    eval_every: int = setting(Integer(0), operational=True)
    log_every: int = setting(Integer(1), operational=True)
    ckpt_every: int = setting(Integer(0), operational=True)
    keep_checkpoints: int = setting(Integer(0), operational=True)
    resume: bool = setting(Choice(BOOLS), operational=True)
    overwrite: bool = setting(Choice(BOOLS), operational=True)  # train over a run already in the directory
    compile: bool = setting(Choice(BOOLS), operational=True)
    compile_mode: str = setting(Choice(COMPILE_MODES), operational=True)
    cuda_graph: Any = setting(Choice(("auto", True, False), shown=("auto", "true", "false")),
                              operational=True)  # speed only: same results
    # the training batch's attention statistics (instruments.attn_stats): read from the forward's own q and k
    attn_stats: Any = setting(Normalized(normalize_attn_stats), operational=True)  # every | off
    attn_stats_every: int = setting(Integer(1), operational=True)
    # fused: in one pass with the attention's forward where the kernel takes it (same results to rounding, as
    # compile); separate: the forward untouched (bitwise), a second pass over q k^T; auto: fused at every step,
    # separate with a cadence (stats_pass below)
    attn_stats_pass: str = setting(Choice(ATTN_STATS_PASSES), operational=True)
    attn_stats_per_head: bool = setting(Choice(BOOLS), operational=True)
    device: str = setting(Device(), operational=True)
    precision: str = setting(Choice(PRECISIONS))
    diverge_factor: float = setting(Finite(low=1, low_inclusive=False))
    diverge_patience: int = setting(Integer(1))
    sample_tokens: int = setting(Integer(0), operational=True)
    # an unmasked model's generation loss on the first n held-out windows (null: all): T/2 forwards a window
    generation_sequences: int | None = setting(Integer(1), operational=True, optional=True)
    progress: Any = setting(Choice(PROGRESS), operational=True)
    progress_every: int = setting(Integer(0), operational=True)

    def __post_init__(self) -> None:
        if self.attn_stats != MISSING:  # Hydra's schema instance holds `???` until a yaml sets it
            self.attn_stats = normalize_attn_stats(self.attn_stats)  # every | off, however it was typed

    @property
    def stats_pass(self) -> str:
        """`attn_stats_pass` resolved: fused | separate. auto: fused at every step, separate with a cadence: on an
        H200 at ANDREA-120M the fused pass costs 1.6% of throughput at every step and, since it replaces the
        attention's forward on all steps, 1.3% at every 10th; the separate pass 3.0% at every step and a tenth of
        that at every 10th (benchmarks/results/attn_stats_h200.json)."""
        if self.attn_stats_pass == "auto":
            return "fused" if self.attn_stats_every == 1 else "separate"
        return self.attn_stats_pass


@dataclass
class ProbeSchema:
    # Probes read the model on a fixed held-out batch and never change training, so every probe setting
    # is operational, the thresholds (dead_jac, dead_grad) and dense schedule included: they change what
    # is measured, not the run, and runs that differ only in them are the same experiment.
    every: int = setting(Integer(0), operational=True)
    batch_size: int = setting(Integer(1), operational=True)
    maps_every: int = setting(Integer(0), operational=True)
    maps_heads: int = setting(Integer(1), operational=True)
    per_head: bool = setting(Choice(BOOLS), operational=True)
    dead_jac: float = setting(Finite(low=0, low_inclusive=False), operational=True)
    dead_grad: float = setting(Finite(low=0, low_inclusive=False), operational=True)
    dense_until: int = setting(Integer(0), operational=True)
    dense_every: int = setting(Integer(0), operational=True)


@dataclass
class LoggerSchema:
    mode: str = setting(Choice(LOGGER_MODES), operational=True)
    project: str = setting(Text(), operational=True)
    entity: str | None = setting(Text(), operational=True, optional=True)
    group: str | None = setting(Text(), operational=True, optional=True)
    tags: list[str] = field(default_factory=list, metadata={"rule": TextList(), "operational": True,
                                                             "optional": False, "sources": None})


@dataclass
class Config:
    model: ModelSchema = field(default_factory=ModelSchema)
    data: DataSchema = field(default_factory=DataSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    probe: ProbeSchema = field(default_factory=ProbeSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    seed: int = setting(Integer(0), operational=True)  # the replicate
    name: str = setting(Text(), operational=True)
    cells_per_gpu: int = setting(Integer(1), operational=True)
    mps: Any = setting(Choice(("auto", True, False)), operational=True)
    # what the report does with the run: judge it (a cell), or read it as progress 1 on its data only
    report_role: str = setting(Choice(("judged", "reference")), operational=True)

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.data.seq_len

    def record(self) -> DictConfig:
        """The settings as the config that records a run (W&B's config, a checkpoint's settings, the summary)."""
        return OmegaConf.structured(self)


ConfigStore.instance().store(name="base_config", node=Config)

# groups Hydra manages beside the settings: all operational
_OPERATIONAL_PREFIXES = ("hydra.", "launcher.")


GROUP_TYPES = {"model": ModelSchema, "data": DataSchema, "train": TrainSchema, "probe": ProbeSchema,
                "logger": LoggerSchema}


def settings() -> dict[str, dataclasses.Field]:
    """Every setting's dotted key and its schema field (groups first, then the top level)."""
    found = {}
    for group, schema in GROUP_TYPES.items():
        for f in dataclasses.fields(schema):
            found[f"{group}.{f.name}"] = f
    for f in dataclasses.fields(Config):
        if f.name not in GROUP_TYPES:
            found[f.name] = f
    return found


SETTINGS: dict[str, dataclasses.Field] = settings()
GROUPS: tuple[str, ...] = tuple(GROUP_TYPES)
SCIENTIFIC_KEYS: tuple[str, ...] = tuple(key for key, f in SETTINGS.items() if not f.metadata["operational"])


def recorded_default(key: str):
    """What a run recorded before scientific setting `key` existed ran as: its default (a setting is added with the
    default that keeps earlier behaviour); MISSING where the schema has none (a yaml must set it)."""
    f = SETTINGS.get(key)
    if f is None or f.metadata["operational"] or f.default is dataclasses.MISSING:
        return MISSING
    return f.default


def fill_later_settings(config: dict) -> dict:
    """config (a run's resolved settings, nested dicts) with each scientific setting it lacks, in a group it holds,
    at recorded_default: so a run recorded before the setting existed pools, resumes and names as one that set it
    to that default."""
    filled = {**config}
    for key in SCIENTIFIC_KEYS:
        group, _, name = key.rpartition(".")
        if group and isinstance(filled.get(group), dict) and name not in filled[group]:
            default = recorded_default(key)
            if default is not MISSING:
                filled[group] = {**filled[group], name: default}
    return filled


def is_scientific(dotted_key: str) -> bool:
    """False for the replicate (seed), naming, launcher, logging, cadence, device and probe settings.

    A key the schema does not know (outside hydra./launcher.) counts as scientific: when in doubt,
    runs that differ in it are not pooled.
    """
    if dotted_key.startswith(_OPERATIONAL_PREFIXES) or dotted_key in ("hydra", "launcher"):
        return False
    if dotted_key in GROUP_TYPES:  # a whole group: scientific when any of its settings is
        return any(key.startswith(dotted_key + ".") for key in SCIENTIFIC_KEYS)
    f = SETTINGS.get(dotted_key)
    return f is None or not f.metadata["operational"]

import andrea_exp.config.slurm_launcher  # noqa: E402,F401  registers the SLURM launcher's settings beside these
