"""hydra/launcher=local_gpus's joblib backend: loky, with worker processes that take the first SIGINT / SIGTERM
from their start (`sweep_stop.WORKER`).

A signal to the whole process group (a closed terminal, `timeout`, a scheduler cancelling the allocation)
reaches every loky worker. By default one that is idle (more slots than cells, or between two cells) or still
setting up its cell dies of it; loky then declares its pool broken, kills the other workers while they write
their checkpoints, and the sweep ends in joblib's TerminatedWorkerError instead of its table.
"""

from __future__ import annotations

from joblib import register_parallel_backend
from joblib.parallel import LokyBackend

from andrea_exp.training import sweep_stop

BACKEND = "loky"  # Hydra's joblib launcher always asks for this one, whatever its `backend` setting says


class SignalSafeLokyBackend(LokyBackend):
    def __init__(self, **kwargs):
        super().__init__(initializer=sweep_stop.take_signals_in_worker, **kwargs)


def register() -> None:
    """Before Hydra's joblib launcher builds its Parallel (at the import of the command line). The launching
    process uses joblib for nothing else."""
    register_parallel_backend(BACKEND, SignalSafeLokyBackend)
