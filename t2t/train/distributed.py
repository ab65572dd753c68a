"""Multi-host start-up: `jax.distributed.initialize`, automatic on Cloud TPU and under SLURM,
explicit elsewhere (coordinator address, process count and id).

Under SLURM, JAX reads the job from the environment `srun` gives each task: the coordinator
is the first node of SLURM_STEP_NODELIST, the process count SLURM_NTASKS, the id
SLURM_PROCID, and each task drives the GPU numbered SLURM_LOCALID (one task per GPU).
"""
from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

import jax

from t2t.errors import UserError
from t2t.platforms import TPU_ENV   # the env vars that mark a Cloud TPU VM

_log = logging.getLogger(__name__)

# What JAX's SLURM detection reads; all are set inside an `srun` task.
_SLURM_TASK_ENV = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                   "SLURM_LOCALID")


def _tpu_chips() -> int:
    """TPU chips on this host's PCI bus (what JAX itself checks to find a TPU VM)."""
    try:
        from jax._src import hardware_utils
        return hardware_utils.num_available_tpu_chips_and_device_id()[0]
    except (ImportError, AttributeError, OSError):   # a private helper: may move
        return 0


def cluster(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """"tpu" on a Cloud TPU VM, "slurm" in one task of a multi-task `srun`, else None."""
    if any(environ.get(k) for k in TPU_ENV) or _tpu_chips() > 0:
        return "tpu"
    if all(k in environ for k in _SLURM_TASK_ENV) and int(environ["SLURM_NTASKS"]) > 1:
        return "slurm"
    if "SLURM_JOB_ID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        _log.warning("SLURM job %s has %s tasks but this process is not one of them: it "
                     "runs alone. Start it with `srun t2t ...` to use them all",
                     environ["SLURM_JOB_ID"], environ["SLURM_NTASKS"])
    return None


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, cpu_collectives: str = "gloo") -> bool:
    """Join the job's processes; returns True when running multi-process.

    With no arguments this lets JAX discover the job on a TPU VM or in a SLURM task and does
    nothing elsewhere (a single-process run). CPU processes talk through `cpu_collectives`.
    """
    if coordinator_address is None:
        if num_processes is not None or process_id is not None:
            raise UserError("--num_processes and --process_id need --coordinator_address "
                            "host:port (process 0's)")
        found = cluster()
        if found is None:
            return False
        _log.info("joining the %s job's processes", found)
        jax.distributed.initialize()
        return jax.process_count() > 1
    if num_processes is None or process_id is None:
        raise UserError("--coordinator_address needs --num_processes and --process_id")
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    return jax.process_count() > 1
