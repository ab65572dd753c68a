"""Cloud TPU chips and slices by name: HBM, datasheet bf16 peak, and the libtpu topology.

A slice is named as Cloud TPU names accelerator types (``v4-8``, ``v5p-128``: TensorCores
for v4 and v5p, two per chip; ``v5e-256`` or ``v5litepod-256``, ``v6e-64``: chips) or by
its topology (``v5e:16x16``, ``v4:4x4x4``: chips along each torus axis).
:func:`topology_devices` gives the slice's devices for ahead-of-time compilation on any
host with libtpu installed (``pip install 't2t[tpu]'``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from typing import Iterator, Sequence

from t2t.errors import UserError

GiB = 1024 ** 3


class TopologyError(UserError, ValueError):
    """A TPU slice, slice count, mesh or batch that cannot be compiled for as asked."""


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation, as its datasheet gives it (per chip)."""

    name: str                 # v4 | v5e | v5p | v6e
    device_kind: str          # what jax.Device.device_kind says
    hbm_bytes: int
    peak_bf16: float          # dense bf16 FLOP/s
    cores_per_name_unit: int  # 2 where accelerator types count TensorCores (v4-8 = 4 chips)
    megacore: bool            # one JAX device per chip spanning its two TensorCores
    shapes: dict              # chips -> torus shape


# Torus shapes of the slice sizes Cloud TPU offers (chips -> shape).
_SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
              128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16),
              2048: (8, 16, 16), 4096: (16, 16, 16)}
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
              128: (8, 16), 256: (16, 16)}

# Datasheets (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): HBM per chip, bf16 peak per chip.
CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GiB, 275e12, 2, True, _SHAPES_3D),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GiB, 197e12, 1, False, _SHAPES_2D),
    "v5p": Chip("v5p", "TPU v5", 95 * GiB, 459e12, 2, True, _SHAPES_3D),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GiB, 918e12, 1, False, _SHAPES_2D),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice: its chip, its libtpu topology name and its size."""

    name: str                 # as the user gave it
    chip: Chip
    topology: str             # libtpu's name, e.g. "v5e:16x16"
    num_chips: int

    @property
    def accelerator_type(self) -> str:
        """Cloud TPU's name of the slice: v4-8, v5litepod-256, v5p-128, v6e-64."""
        prefix = "v5litepod" if self.chip.name == "v5e" else self.chip.name
        return f"{prefix}-{self.num_chips * self.chip.cores_per_name_unit}"


def known_names() -> list[str]:
    """Accelerator-type names this module knows (one per offered slice size)."""
    names = []
    for chip in CHIPS.values():
        names += [f"{chip.name}-{n * chip.cores_per_name_unit}" for n in chip.shapes]
    return names


def _unknown(name: str) -> TopologyError:
    return TopologyError(f"unknown TPU topology {name!r}: give an accelerator type such as "
                      f"v4-8, v5e-256, v5p-128, v6e-64 or a topology such as v5e:16x16 "
                      f"(chips: {', '.join(CHIPS)})")


def _chip(prefix: str, name: str) -> Chip:
    prefix = _ALIASES.get(prefix.lower(), prefix.lower())
    if prefix not in CHIPS:
        raise _unknown(name)
    return CHIPS[prefix]


def parse(name: str) -> Slice:
    """``v5e-256`` / ``v5litepod-256`` / ``v4-8`` / ``v5e:16x16`` -> Slice; a clear
    ValueError for anything else (before libtpu is touched)."""
    typed = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
    torus = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+){1,2})", name.strip().lower())
    if typed:
        chip = _chip(typed.group(1), name)
        units = int(typed.group(2))
        chips = units // chip.cores_per_name_unit
        if units % chip.cores_per_name_unit or chips not in chip.shapes:
            sizes = ", ".join(f"{chip.name}-{n * chip.cores_per_name_unit}" for n in chip.shapes)
            raise TopologyError(f"{name!r} is not a {chip.name} slice Cloud TPU offers; "
                             f"choose one of {sizes}")
        shape = chip.shapes[chips]
    elif torus:
        chip = _chip(torus.group(1), name)
        shape = tuple(int(s) for s in torus.group(2).split("x"))
        if len(shape) != len(next(iter(chip.shapes.values()))):
            raise TopologyError(f"{name!r}: a {chip.name} topology has "
                             f"{len(next(iter(chip.shapes.values())))} axes, e.g. "
                             f"{chip.name}:{'x'.join(map(str, chip.shapes[max(chip.shapes)]))}")
        chips = math.prod(shape)
    else:
        raise _unknown(name)
    return Slice(name, chip, f"{chip.name}:{'x'.join(map(str, shape))}", chips)


def topology_devices(slice_: Slice, num_slices: int = 1) -> Sequence:
    """Compile-only JAX devices of `num_slices` such slices (one per chip; multi-slice
    devices carry ``slice_index``). Needs libtpu, not a TPU."""
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
        raise UserError("compiling for a TPU topology needs libtpu: "
                           "pip install 't2t[tpu]' (or 'jax[tpu]==0.10.2')")
    import jax
    from jax.experimental import topologies
    kwargs = {"chip_config_name": "megacore"} if slice_.chip.megacore else {}
    if num_slices > 1:
        kwargs["num_slices"] = num_slices
    # libtpu guards the TPU with a lockfile; compiling opens no TPU, so several compiles
    # (and a training run on a TPU host) may share it. Off a TPU VM, libtpu would warn at
    # length that it cannot find the VM's accelerator type and workers: name them (only
    # while libtpu starts; nothing else in this process should think it is on a TPU VM).
    with _environ(ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_ACCELERATOR_TYPE=slice_.accelerator_type,
                  TPU_WORKER_HOSTNAMES="localhost"):
        try:
            devices = topologies.get_topology_desc(topology_name=slice_.topology,
                                                   platform="tpu", **kwargs).devices
        except jax.errors.JaxRuntimeError as e:   # a shape libtpu cannot lay out on hosts
            said = str(e).splitlines()[0].split("INVALID_ARGUMENT:")[-1].strip()
            offered = ", ".join(f"{slice_.chip.name}:{'x'.join(map(str, s))}"
                                for s in slice_.chip.shapes.values())
            raise TopologyError(f"libtpu cannot build {slice_.name!r}: {said}; the "
                                f"{slice_.chip.name} slices Cloud TPU offers: {offered}"
                                ) from None
    expected = slice_.num_chips * num_slices
    if len(devices) != expected:
        raise RuntimeError(f"libtpu made {len(devices)} devices for {slice_.topology} x "
                           f"{num_slices}, expected {expected}")
    return devices


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Sets environment variables that are unset, and unsets them again afterwards."""
    added = [k for k, v in values.items() if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)
