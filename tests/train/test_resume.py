"""Kill a real `t2t train` with SIGKILL, rerun the same command: the losses after the
restart and the final parameters equal an uninterrupted run's, bit for bit (CPU)."""
import json
import os

import numpy as np
import orbax.checkpoint as ocp

from tests.train.cli_launcher import run_t2t

TINY = ["--gin_file=experiments/t5_tiny_bible.gin", "--gin_file=models/t5/1_1/test.gin",
        "--gin.TRAIN_STEPS=8", "--gin.BATCH_SIZE=4",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
        "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.checkpoint_every=3",
        "--gin.TrainConfig.progress_bar=False", "--gin.TransformerConfig.dropout_rate=0.1"]


def t2t_train(model_dir, kill_after=0):
    env = dict(SIGNAL="SIGKILL", SIGNAL_AFTER=kill_after, WAIT_FOR_CHECKPOINT=3) if kill_after else {}
    return run_t2t(["train", *TINY, f"--gin.MODEL_DIR={model_dir}"], **env)


def logged(model_dir):
    """step -> (loss, grad_norm), the last record of each step (a resumed run re-logs)."""
    out = {}
    for line in open(os.path.join(model_dir, "metrics.jsonl")):
        record = json.loads(line)
        if "loss" in record:
            out[record["step"]] = (record["loss"], record["grad_norm"])
    return out


def final_params(model_dir, step=8):
    state = ocp.StandardCheckpointer().restore(os.path.join(model_dir, "checkpoints", str(step),
                                                            "state"))
    return state["params"]


def test_sigkill_then_rerun_is_bitwise_identical(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    done = t2t_train(straight)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = t2t_train(interrupted, kill_after=5)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "3" in os.listdir(interrupted / "checkpoints")
    assert "6" not in os.listdir(interrupted / "checkpoints")  # killed before step 6
    assert max(logged(interrupted)) == 4  # step 5 ran but died before it was logged

    resumed = t2t_train(interrupted)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = logged(straight), logged(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in range(4, 9):            # every step after the restart
        assert a[step] == b[step], (step, a[step], b[step])
    pa, pb = final_params(straight), final_params(interrupted)
    leaves_a, leaves_b = (sorted(_flat(p).items()) for p in (pa, pb))
    assert [k for k, _ in leaves_a] == [k for k, _ in leaves_b]
    for (name, x), (_, y) in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}/{k}"))
        return out
    return {prefix: tree}
