"""Hydra looks for launchers only under the hydra_plugins namespace: the project's SLURM launcher
(andrea_exp.launch.slurm) is named here, as conf/hydra/launcher/slurm.yaml's _target_."""

from andrea_exp.launch import slurm


class SlurmLauncher(slurm.SlurmLauncher):
    """Hydra's submitit SLURM launcher that waits for every cell and reports each one's SLURM state."""


def register() -> None:
    """Name the launcher to Hydra directly. Hydra finds plugins by walking the folders of hydra_plugins, which
    misses this one when the project is installed in editable mode (setuptools reaches it through an import
    hook, not a folder)."""
    from hydra.core.plugins import Plugins

    Plugins.instance()._register(SlurmLauncher)
