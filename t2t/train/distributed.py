"""Multi-host start-up: `jax.distributed.initialize`, automatic on Cloud TPU, explicit
elsewhere (coordinator address, process count and id)."""
from __future__ import annotations

import os
from typing import Optional

import jax

_TPU_ENV = ("TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID", "TPU_ACCELERATOR_TYPE")


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, cpu_collectives: str = "gloo") -> bool:
    """Join the job's processes; returns True when running multi-process.

    With no arguments this does nothing off TPU (a single-process run) and lets JAX
    discover the topology on a TPU VM. CPU processes talk through `cpu_collectives`.
    """
    explicit = coordinator_address is not None
    if not explicit and not any(os.environ.get(k) for k in _TPU_ENV):
        return False
    if explicit:
        if num_processes is None or process_id is None:
            raise ValueError("--coordinator_address needs --num_processes and --process_id")
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    else:
        jax.distributed.initialize()
    return jax.process_count() > 1
