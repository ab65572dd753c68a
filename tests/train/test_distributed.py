"""`distributed.initialize` finds the job it runs in: SLURM tasks and Cloud TPU VMs join
through `jax.distributed.initialize()`, a lone process does nothing (faked environments)."""
import logging

import jax
import pytest

from t2t.errors import UserError
from t2t.train import distributed

# What `srun --nodes=2 --ntasks-per-node=4 --gpus-per-node=4` gives task 5.
SRUN_TASK = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[017-018]",
             "SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
             "SLURM_STEP_NUM_NODES": "2"}
ENV_PREFIXES = ("SLURM_", "TPU_", "CLOUD_TPU_", "MEGASCALE_")


@pytest.fixture
def calls(monkeypatch):
    """A clean environment (no SLURM/TPU variables, no TPU chips); records what
    `jax.distributed.initialize` was called with instead of calling it."""
    import os
    for key in list(os.environ):
        if key.startswith(ENV_PREFIXES):
            monkeypatch.delenv(key)
    monkeypatch.setattr(distributed, "_tpu_chips", lambda: 0)
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize",
                        lambda *args, **kwargs: recorded.append((args, kwargs)))
    return recorded


def test_srun_task_lets_jax_read_slurm(calls, monkeypatch):
    for key, value in SRUN_TASK.items():
        monkeypatch.setenv(key, value)
    assert distributed.cluster() == "slurm"
    distributed.initialize()
    assert calls == [((), {})]          # JAX's own SLURM detection fills in the rest


def test_jax_derives_the_job_from_the_same_slurm_environment(calls, monkeypatch):
    """What JAX does with the environment `cluster()` accepted: coordinator on the first
    node, 8 processes, this one number 5 driving its node's GPU 1."""
    from jax._src.clusters import ClusterEnv, SlurmCluster
    for key, value in SRUN_TASK.items():
        monkeypatch.setenv(key, value)
    assert SlurmCluster.is_env_present()
    monkeypatch.delenv("JAX_COORDINATOR_PORT", raising=False)
    address, count, pid, local = ClusterEnv.auto_detect_unset_distributed_params(
        coordinator_address=None, num_processes=None, process_id=None,
        local_device_ids=None, cluster_detection_method=None, initialization_timeout=None)
    assert (address, count, pid, local) == (f"gpu017:{4242 % 4096 + 61440}", 8, 5, [1])


def test_single_task_slurm_job_runs_alone(calls, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert distributed.cluster() is None
    assert distributed.initialize() is False and calls == []


def test_sbatch_shell_without_srun_warns_and_runs_alone(calls, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "16")     # the allocation's, but no srun step
    with caplog.at_level(logging.WARNING):
        assert distributed.initialize() is False
    assert calls == [] and "srun t2t" in caplog.text


@pytest.mark.parametrize("key", ["TPU_WORKER_HOSTNAMES", "TPU_NAME"])
def test_cloud_tpu_env_lets_jax_read_the_slice(calls, monkeypatch, key):
    monkeypatch.setenv(key, "t1v-n-0,t1v-n-1")
    distributed.initialize()
    assert calls == [((), {})]


def test_tpu_chips_on_the_bus_count_as_a_tpu_vm(calls, monkeypatch):
    monkeypatch.setattr(distributed, "_tpu_chips", lambda: 4)
    assert distributed.cluster() == "tpu"


def test_plain_host_does_nothing(calls):
    assert distributed.cluster() is None
    assert distributed.initialize() is False and calls == []


def test_explicit_arguments_win_and_must_be_complete(calls, monkeypatch):
    for key, value in SRUN_TASK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    distributed.initialize("host:1234", 2, 1)
    assert calls == [(("host:1234", 2, 1), {})]
    with pytest.raises(UserError, match="needs --num_processes"):
        distributed.initialize("host:1234")
    with pytest.raises(UserError, match="need --coordinator_address"):
        distributed.initialize(num_processes=2)
