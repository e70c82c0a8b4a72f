"""The settings of conf/hydra/launcher/slurm.yaml: submitit's SLURM settings and the launcher's own, registered
in Hydra's ConfigStore as `hydra/launcher/slurm_settings` (slurm.yaml extends it, so a key that is neither is
refused when Hydra composes)."""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

ON_INTERRUPT = ("keep", "cancel")  # Ctrl-C / SIGTERM on the launcher: its jobs run on, or are cancelled


@dataclass
class SlurmLauncherConf(SlurmQueueConf):
    on_interrupt: str = "keep"  # one of ON_INTERRUPT (checked by andrea_exp.launch.slurm before it submits)


ConfigStore.instance().store(group="hydra/launcher", name="slurm_settings", node=SlurmLauncherConf,
                             provider="andrea_exp")
