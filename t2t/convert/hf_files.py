"""Hugging Face model directories on disk: config.json and safetensors weights (one file or
an index of shards) read, and written back. Pickle checkpoints (`*.bin`) are refused."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Tuple

import numpy as np
from safetensors.numpy import load_file, save_file

from t2t.errors import InputFileError
from t2t.nn.config import TransformerConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """All tensors of `model.safetensors` (or of the shards its index names) in `path`."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return load_file(path)
    single, index = os.path.join(path, WEIGHTS_FILE), os.path.join(path, WEIGHTS_INDEX_FILE)
    if os.path.exists(single):
        return load_file(single)
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for shard in shards:
            state.update(load_file(os.path.join(path, shard)))
        return state
    raise FileNotFoundError(f"no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} in {path!r} (t2t reads "
                            "safetensors only; pickle checkpoints such as *.bin are refused)")


def read_json(path: str) -> Any:
    """A JSON file such as a Hugging Face config.json; one that is not UTF-8 JSON (binary,
    compressed, cut short) is an InputFileError naming it and the place."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise InputFileError(f"{path} is not UTF-8 text (a binary or compressed file?): it "
                             "should be JSON; copy it again from the model's source") from None
    except json.JSONDecodeError as e:
        raise InputFileError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} "
                             f"({e.msg}); cut short, or something after the JSON? copy it "
                             "again") from None


def read_config(path: str) -> dict:
    """config.json of the directory `path` (or of the directory holding the file `path`)."""
    path = os.fspath(path)
    directory = os.path.dirname(path) if os.path.isfile(path) else path
    return read_json(os.path.join(directory, CONFIG_FILE))


def load_directory(path, config_fn: Callable[[dict], TransformerConfig], params_fn: Callable,
                   overrides: dict) -> Tuple[TransformerConfig, Any]:
    """(config_fn(config.json) with `overrides` replacing fields, params_fn(tensors, config))."""
    config = config_fn(read_config(path))
    if overrides:
        config = config.replace(**overrides)
    return config, params_fn(read_safetensors(path), config)


def write_directory(path, hf_config: dict, state: Dict[str, np.ndarray]) -> None:
    """config.json + model.safetensors that `transformers` loads."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    save_file(state, os.path.join(path, WEIGHTS_FILE), metadata={"format": "pt"})
