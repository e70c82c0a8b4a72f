"""Hydra looks for launchers only under the hydra_plugins namespace: the project's SLURM launchers
(andrea_exp.launch.slurm) are named here, as conf/hydra/launcher/slurm.yaml's and slurm_local.yaml's _target_."""

from andrea_exp.launch import slurm


class SlurmLauncher(slurm.SlurmLauncher):
    """Hydra's submitit SLURM launcher that waits for every cell and reports each one's SLURM state."""


class SlurmLocalLauncher(slurm.LocalLauncher):
    """The same path on this machine (submitit's local executor), stopped cleanly by Ctrl-C."""


def register() -> None:
    """Name the launcher to Hydra directly. Hydra finds plugins by walking the folders of hydra_plugins, which
    misses this one when the project is installed in editable mode (setuptools reaches it through an import
    hook, not a folder)."""
    from hydra.core.plugins import Plugins

    for launcher in (SlurmLauncher, SlurmLocalLauncher):
        Plugins.instance()._register(launcher)
