"""The gcloud calls of a Cloud TPU job, as argument lists (never shell strings).

A job is one queued resource: a single slice (`--node-id=NAME`) or several identical
slices joined over the data-centre network (`--node-count=N --node-prefix=NAME`, nodes
NAME-0 … NAME-{N-1}). Every function here only builds argv; `t2t.launch.tpu` runs them.
"""
from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, Tuple

from t2t.errors import UserError

# How researchers name a slice -> (gcloud's accelerator-type prefix, TPU VM runtime version).
FAMILIES = {
    "v4": ("v4", "tpu-ubuntu2204-base"),
    "v5e": ("v5litepod", "v2-alpha-tpuv5-lite"),
    "v5litepod": ("v5litepod", "v2-alpha-tpuv5-lite"),
    "v5p": ("v5p", "v2-alpha-tpuv5"),
    "v6e": ("v6e", "v2-alpha-tpuv6e"),
}
# Queued-resource states (`state.state`) while the slice is on its way, and once it is gone.
WAITING = ("CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES")
ACTIVE = "ACTIVE"
LOST = ("SUSPENDING", "SUSPENDED", "FAILED", "PREEMPTED", "DELETING")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,46}[a-z0-9])?$")


class LaunchError(UserError):
    """A launch that cannot go on: a bad argument, or a gcloud call that failed."""


def accelerator_type(accelerator: str) -> Tuple[str, str]:
    """`v5e-256` -> (`v5litepod-256`, `v2-alpha-tpuv5-lite`): gcloud's type and runtime."""
    family, _, size = accelerator.partition("-")
    if family not in FAMILIES or not size.isdigit():
        raise LaunchError(f"--accelerator {accelerator!r}: expected FAMILY-SIZE with FAMILY one "
                          f"of {', '.join(FAMILIES)} (e.g. v5e-256, v4-8, v5p-128, v6e-64)")
    prefix, runtime = FAMILIES[family]
    return f"{prefix}-{size}", runtime


@dataclasses.dataclass(frozen=True)
class Slice:
    """Where a job runs: the queued resource NAME and its node(s)."""

    name: str
    zone: str
    accelerator: str = "v5e-8"
    num_slices: int = 1
    project: Optional[str] = None
    spot: bool = False
    reserved: bool = False
    runtime_version: Optional[str] = None

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise LaunchError(f"--name {self.name!r}: use lower-case letters, digits and '-', "
                              "starting with a letter (a TPU node name)")
        if self.num_slices < 1:
            raise LaunchError(f"--num_slices must be >= 1, got {self.num_slices}")
        accelerator_type(self.accelerator)                 # a bad name fails here, early
        if self.spot and self.reserved:
            raise LaunchError("--spot and --reserved exclude each other: choose one")

    @property
    def nodes(self) -> List[str]:
        """The TPU VM node of each slice (the queued resource names them)."""
        if self.num_slices == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.num_slices)]

    def _where(self) -> List[str]:
        return [f"--zone={self.zone}"] + ([f"--project={self.project}"] if self.project else [])

    def create(self) -> List[str]:
        """`queued-resources create`: one slice, or num_slices of them for DCN."""
        accelerator, runtime = accelerator_type(self.accelerator)
        nodes = ([f"--node-id={self.name}"] if self.num_slices == 1 else
                 [f"--node-count={self.num_slices}", f"--node-prefix={self.name}"])
        kind = ["--spot"] * self.spot + ["--reserved"] * self.reserved
        return (["gcloud", "compute", "tpus", "queued-resources", "create", self.name]
                + nodes + self._where()
                + [f"--accelerator-type={accelerator}",
                   f"--runtime-version={self.runtime_version or runtime}"] + kind)

    def state(self) -> List[str]:
        """`queued-resources describe`, printing only the state (ACTIVE, SUSPENDED, …)."""
        return (["gcloud", "compute", "tpus", "queued-resources", "describe", self.name]
                + self._where() + ["--format=value(state.state)"])

    def describe(self) -> List[str]:
        """The queued resource in full (for `t2t launch status`)."""
        return ["gcloud", "compute", "tpus", "queued-resources", "describe", self.name] + \
            self._where()

    def delete(self) -> List[str]:
        """Delete the queued resource and its nodes, without a prompt."""
        return (["gcloud", "compute", "tpus", "queued-resources", "delete", self.name]
                + self._where() + ["--force", "--quiet"])

    def node_ip(self, node: str, worker: int = 0) -> List[str]:
        """The internal IP of `node`'s `worker` (slice 0 worker 0 coordinates DCN)."""
        return (["gcloud", "compute", "tpus", "tpu-vm", "describe", node] + self._where()
                + [f"--format=value(networkEndpoints[{worker}].ipAddress)"])

    def scp(self, node: str, local: str, remote: str) -> List[str]:
        """Copy a local file to every worker of `node` (`remote` is relative to $HOME)."""
        return (["gcloud", "compute", "tpus", "tpu-vm", "scp", local, f"{node}:{remote}",
                 "--worker=all"] + self._where() + ["--quiet"])

    def ssh(self, node: str, command: str, worker: str = "all") -> List[str]:
        """Run the shell `command` on `worker` ("all" or an index) of `node`."""
        return (["gcloud", "compute", "tpus", "tpu-vm", "ssh", node, f"--worker={worker}"]
                + self._where() + ["--quiet", f"--command={command}"])
