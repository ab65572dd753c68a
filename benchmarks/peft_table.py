"""The lightweight fine-tuning table: full fine-tuning, LoRA, adapters, prefix and prompt
tuning of the real all-MiniLM-L6-v2 on the same small task and seeds, each run one
`t2t finetune` command (experiments/peft_minilm_paraphrase.gin plus runs/peft_<method>.gin),
one at a time, every method once before the next seed; a rerun with the same --out skips
the runs already in its peft_table.json. Prints a markdown table: trainable parameters
(counted on the wrapped model the same gin files build), test accuracy mean ± half the
spread over the seeds, wall time.

    python benchmarks/peft_table.py --out /tmp/peft [--seeds 0 1] [--methods full lora ...]
        [--epochs 8]   (default: the experiment's EPOCHS)
        [--bindings "TransformerConfig.dtype='float32'"]   (more gin bindings for every run)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

EXPERIMENT = "experiments/peft_minilm_paraphrase.gin"
# Learning rates: the BERT recipe's range for full fine-tuning; the lightweight methods train
# few parameters from scratch and want larger steps (LoRA and adapters 1e-3 as in their
# papers' GLUE runs, prefix 1e-3 through its MLP, prompts 3e-2).
LEARNING_RATES = {"full": 1e-4, "lora": 1e-3, "adapter": 1e-3, "prefix": 1e-3, "prompt": 3e-2}


def gin_files(method: str) -> list:
    return [EXPERIMENT] + ([] if method == "full" else [f"runs/peft_{method}.gin"])


def trainable_parameters(method: str) -> tuple:
    """(trainable, total) parameters of the classifier the method's gin files build."""
    import jax
    import numpy as np
    from t2t.convert.hf import load_bert
    from t2t.models.classifiers import SequenceClassifier
    from t2t.run import configurables as configured
    from t2t.run import gin_utils
    from t2t.run.vocabularies import minilm_l6_v2_path
    gin_utils.parse(gin_files(method), ["MODEL_DIR = '/tmp/unused'"])
    config, _ = load_bert(minilm_l6_v2_path())
    model = configured.wrap(SequenceClassifier(config, 2))
    batch = {"encoder_input_tokens": np.ones((1, 16), np.int32),
             "encoder_segment_ids": np.ones((1, 16), np.int32),
             "token_type_ids": np.zeros((1, 16), np.int32)}
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), batch))
    import flax.linen as nn
    params = nn.unbox(params)
    total = sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
    trainable = model.trainable_count(params) if hasattr(model, "trainable_count") else total
    return trainable, total


def run(method: str, seed: int, out: str, epochs: float | None = None,
        bindings: tuple = ()) -> dict:
    model_dir = os.path.join(out, f"{method}_{seed}")
    cmd = [sys.executable, "-m", "t2t.cli", "finetune", *[f"--gin_file={g}" for g in
                                                          gin_files(method)],
           f"--gin.MODEL_DIR={model_dir}", f"--gin.SEED={seed}",
           f"--gin.LEARNING_RATE={LEARNING_RATES[method]}"]
    if epochs is not None:
        cmd.append(f"--gin.EPOCHS={epochs}")
    cmd += [f"--gin.{b}" for b in bindings]
    print(" ".join(["t2t", *cmd[3:]]), flush=True)
    start = time.time()
    subprocess.run(cmd, check=True)
    seconds = time.time() - start
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    test = next(v for k, v in metrics.items() if k.endswith("/test"))
    return {"method": method, "seed": seed, "accuracy": test["accuracy"], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--methods", nargs="+", default=list(LEARNING_RATES))
    parser.add_argument("--epochs", type=float, default=None,
                        help="passes over the training pairs (default: the experiment's)")
    parser.add_argument("--bindings", nargs="*", default=[], help="gin bindings for every run")
    args = parser.parse_args()
    table = os.path.join(args.out, "peft_table.json")
    rows = json.load(open(table)) if os.path.exists(table) else []   # rerun: resume
    for seed in args.seeds:              # every method once before the next seed
        for method in args.methods:
            if any(r["method"] == method and r["seed"] == seed for r in rows):
                continue
            rows.append(run(method, seed, args.out, args.epochs, tuple(args.bindings)))
            with open(table, "w") as f:
                json.dump(rows, f, indent=1)
    print("| method | trainable parameters | test accuracy (mean ± half spread) | wall per run |")
    print("|---|---:|---:|---:|")
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        acc = [r["accuracy"] for r in mine]         # metrics.json holds percent
        trainable, total = trainable_parameters(method)
        print(f"| {method} | {trainable:,} ({100 * trainable / total:.2f}%) | "
              f"{sum(acc) / len(acc):.1f} ± {(max(acc) - min(acc)) / 2:.1f} | "
              f"{sum(r['seconds'] for r in mine) / len(mine):.0f} s |")


if __name__ == "__main__":
    main()
