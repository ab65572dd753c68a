"""`t2t compile`: train steps compiled ahead of time for TPU slices, on this CPU host.

Needs libtpu (the `test` extra installs it); the process stays on the CPU backend. One
compile per family here (BERT on v4-8, T5 on v5e-256, GPT on two v5e-256 slices); every
hardware config x family is behind `slow`.
"""
import importlib.util
import re
from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

from t2t import cli
from t2t.nn import attention_kernels
from t2t.train import chips, flops, partitioning

from t2t.run import aot

from tests.tiers import sweep

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install -e '.[test]')")
HARDWARE = sorted(p.stem for p in (Path(cli.__file__).parent.parent / "configs" / "hardware")
                  .glob("tpu_*.gin"))
FAMILY_RUNS = {   # family: test-size model on its tiny Bible experiment
    "bert": ["experiments/bert_tiny_bible.gin", "models/bert/test.gin",
             "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'max_predictions': 4}"],
    "t5": ["experiments/t5_tiny_bible.gin", "models/t5/1_1/test.gin",
           "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}"],
    "gpt": ["experiments/gpt_tiny_bible.gin", "models/gpt2/test.gin",
            "--gin.TASK_FEATURE_LENGTHS={'targets': 32}"],
}
VERDICT = re.compile(r"^(fits|does not fit): \d+\.\d\d GiB of \d+\.\d\d GiB HBM per chip on \S+"
                     r"( x \d+ slices)?$")


def _args(family, hardware, *extra):
    files, flags = [], []
    for a in FAMILY_RUNS[family] + [f"hardware/{hardware}.gin", "--gin.BATCH_SIZE=128"] + list(
            extra):
        (flags if a.startswith("--") else files).append(a)
    return ["compile"] + [f"--gin_file={f}" for f in files] + flags


def _run(capsys, args):
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out.strip().splitlines(), err


def _compile(family, hardware, *extra, step="train"):
    """aot.compile_for as `t2t compile` calls it, returning the Report."""
    bindings, rest = cli._gin_args(_args(family, hardware, *extra)[1:])
    aot.parse_gin([a.split("=", 1)[1] for a in rest], bindings)
    return aot.compile_for(*aot.target_from_config(None, None), step=step)


# ----------------------------------------------------------------------------- no compile


@pytest.mark.all_devices
def test_xla_flops_count_every_microbatch_and_scanned_layer(tmp_path):
    """XLA's cost analysis counts a loop body once: the count lowers scanned layers unrolled
    and microbatches as one batch, so a scanned, microbatched step counts as the plain one."""
    import optax

    from t2t.models.families import make_model
    from t2t.train.trainer import TrainConfig, Trainer
    from tests.nn.helpers import T5_TINY
    from tests.train.fakes import RandomCopyData

    batch = next(RandomCopyData())
    mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))

    def count(scan_layers, num_microbatches):
        model = make_model("t5", T5_TINY.replace(scan_layers=scan_layers))
        config = TrainConfig(model_dir=str(tmp_path), num_microbatches=num_microbatches)
        return aot.hlo_flops(Trainer(model, optax.adam(1e-3), mesh, config), batch)

    plain = count(False, 1)
    assert plain > 0
    assert count(True, 4) == pytest.approx(plain, rel=0.01)


@pytest.mark.parametrize("name, topology, chips_", [
    ("v4-8", "v4:2x2x1", 4), ("v4-128", "v4:4x4x4", 64), ("v5e-8", "v5e:2x4", 8),
    ("v5litepod-256", "v5e:16x16", 256), ("v5p-128", "v5p:4x4x4", 64),
    ("v6e-64", "v6e:8x8", 64), ("v5e:4x8", "v5e:4x8", 32)])
def test_slice_names(name, topology, chips_):
    s = chips.parse(name)
    assert (s.topology, s.num_chips) == (topology, chips_)


@pytest.mark.parametrize("name, says", [("v9-8", "unknown TPU topology"),
                                        ("v4-6", "not a v4 slice"),
                                        ("v5e:4x4x4", "has 2 axes"), ("tpu", "unknown")])
def test_bad_slice_names(name, says):
    with pytest.raises(chips.TopologyError, match=says) as e:
        chips.parse(name)
    assert "\n" not in str(e.value)


def test_datasheet_peaks_match_flops_table():
    """chips.CHIPS and flops.peak_flops_per_device (used for MFU in training) agree."""
    class Device:
        def __init__(self, kind):
            self.device_kind = kind
    for chip in chips.CHIPS.values():
        assert flops.peak_flops_per_device(Device(chip.device_kind)) == chip.peak_bf16


@needs_libtpu
@pytest.mark.parametrize("args, says", [
    (["--topology=v7x-8"], "unknown TPU topology 'v7x-8'"),
    (["--topology=v5e:3x3"], "libtpu cannot build 'v5e:3x3': Topology layout \"v5e:3x3\" is "
                             "not divisible"),
    (["--topology=v5e-8"], "needs 256 devices but 8 are available (on v5e-8: 8 chips)"),
    (["--gin.BATCH_SIZE=100"], "global batch size 100 is not divisible by the 128 ways"),
    (["--num_slices=2"], "but --num_slices=2; bind MeshConfig.dcn_data=2"),
    (["--gin.TransformerConfig.num_heads=3"], "(heads=3) is not divisible by mesh axis tensor=2"),
])
def test_bad_requests_are_one_line_before_compiling(capsys, args, says):
    code, out, err = _run(capsys, _args("t5", "tpu_v5e_256", *args))
    assert code == 2 and out == []
    lines = [l for l in err.splitlines() if l.startswith("t2t compile: error:")]
    assert len(lines) == 1 and says in lines[0], err


@needs_libtpu
def test_gpt2_xl_heads_on_the_v5e_256_mesh_are_one_line(capsys):
    """GPT-2 XL's 25 heads and tensor=2: one line before compiling (docs/tpu.md's table binds
    tensor=1 for it: benchmarks/compile_table.py's MESH_OVERRIDES)."""
    code, out, err = _run(capsys, [
        "compile", "--gin_file=models/gpt2/xl.gin", "--gin_file=objectives/causal_lm.gin",
        "--gin_file=runs/pretrain_gpt.gin", "--gin_file=hardware/tpu_v5e_256.gin",
        "--gin.CORPUS=c4", "--gin.BATCH_SIZE=512", "--gin.experiment.vocab_size_from_task=False"])
    lines = [l for l in err.splitlines() if l.startswith("t2t compile: error:")]
    assert code == 2 and out == [] and len(lines) == 1, err
    assert "(heads=25) is not divisible by mesh axis tensor=2" in lines[0]


# ----------------------------------------------------------------------------- compiles


def _leaf(tree, *path):
    for key in path:
        tree = tree[key]
    return tree


@pytest.mark.slow    # ~20 s; CI compiles T5 for v5e-256 through the CLI
@needs_libtpu
def test_bert_compiles_for_v4_8_and_shards_as_the_rules_say(capsys):
    report = _compile("bert", "tpu_v4_8", "--gin.BATCH_SIZE=8")
    assert report.fits and report.num_chips == 4 and report.mesh == {
        "data": 1, "fsdp": 4, "tensor": 1}
    assert VERDICT.match(report.verdict()) and report.verdict().endswith("on v4-8")
    params_in, batch_in = report.compiled.input_shardings[0]
    emb = _leaf(params_in.params, "token_embedder", "embedding")
    vocab, d_model = 8064, 32                 # the Bible WordPiece, padded; models/bert/test
    assert emb.spec == P("tensor", "fsdp") and emb.shard_shape((vocab, d_model)) == (vocab, 8)
    rows = batch_in["encoder_input_tokens"]
    assert rows.spec == P(("data", "fsdp")) and rows.shard_shape((8, 32)) == (2, 32)
    # XLA's per-chip arguments hold at least our per-chip parameters + optimizer state.
    s = report.state_bytes
    assert report.memory["arguments"] >= s["parameters"] + s["optimizer_state"] > 0
    assert 0.5 < report.mfu_ceiling <= 1.1
    assert jax.default_backend() == "cpu" and len(jax.devices()) == 8


@needs_libtpu
def test_t5_compiles_for_v5e_256_through_the_command_line(capsys, tmp_path):
    code, out, _ = _run(capsys, _args("t5", "tpu_v5e_256", f"--json={tmp_path}/r.json"))
    assert code == 0, out
    assert VERDICT.match(out[-1]) and out[-1].startswith("fits: ") and out[-1].endswith(
        "HBM per chip on v5e-256")
    assert "mesh data=16 x fsdp=8 x tensor=2" in out[0] and "256 chips (TPU v5 lite)" in out[0]
    assert any(l.startswith("  temporaries") for l in out)
    import json
    numbers = json.loads((tmp_path / "r.json").read_text())
    assert numbers["fits"] and numbers["chips"] == 256 and numbers["hbm_bytes"] == 16 * 2**30
    # XLA's HLO FLOPs: the model's matmuls plus full remat's second forward pass.
    assert 1.0 < numbers["xla_flops_per_chip"] / numbers["model_flops_per_chip"] < 1.6


@pytest.mark.slow    # ~19 s; CI compiles T5 for v5e-256 through the CLI
@needs_libtpu
def test_gpt_compiles_for_two_v5e_256_slices(capsys):
    report = _compile("gpt", "tpu_v5e_256x2")
    assert report.fits and report.num_chips == 512 and report.num_slices == 2
    assert report.mesh == {"data": 16, "fsdp": 8, "tensor": 4}
    _, batch_in = report.compiled.input_shardings[0]
    tokens = batch_in["decoder_input_tokens"]
    assert tokens.shard_shape((128, 32)) == (1, 32)
    slices = {d.slice_index for d in tokens.mesh.devices[:, 0, 0]}
    assert slices == {0, 1}            # the data axis spans the two slices over DCN


@needs_libtpu
def test_a_config_that_cannot_fit_says_so_and_exits_1(capsys):
    # a 2M-token vocabulary at d_model 4096: 8.6G embedding parameters with AdamW's two
    # moments is 12 GiB per chip of a v5e-8, and the logits' matmul gathers the whole
    # embedding (tensor=1): XLA refuses the 48 GiB of temporaries.
    code, out, _ = _run(capsys, _args("gpt", "tpu_v5e_8", "--gin.BATCH_SIZE=8",
                                      "--gin.experiment.vocab_size_from_task=False",
                                      "--gin.TransformerConfig.vocab_size=2097152",
                                      "--gin.TransformerConfig.d_model=4096"))
    assert code == 1
    assert VERDICT.match(out[-1]) and out[-1].startswith("does not fit: ")
    start = out.index("largest buffers per chip:")
    largest = out[start + 1:-1]
    assert len(largest) == 3 and all("->" in l for l in largest)
    assert "[2097152,4096]" in largest[0] and "-> tensor" in largest[0]
    assert any(l.startswith("XLA stopped compiling") for l in out)
    params = next(l for l in out if l.strip().startswith("parameters"))
    assert abs(float(params.split()[-1]) - 2097152 * 4096 * 4 / 8 / 2**30) < 0.01
    assert float(out[-1].split()[3]) > 16.0


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("family", sorted(FAMILY_RUNS))
@pytest.mark.parametrize("hardware", HARDWARE)
def test_every_hardware_config_compiles_and_fits(family, hardware):
    """Each hardware config's mesh, dtype and remat policy compile for each family."""
    # d_model 64: the 64-chip configs shard every embed dimension 64 ways (fsdp)
    report = _compile(family, hardware, "--gin.TransformerConfig.d_model=64")
    assert report.fits and VERDICT.match(report.verdict())
    mesh = report.mesh
    _, batch_in = report.compiled.input_shardings[0]
    rows = next(iter(batch_in.values())).shard_shape((128, 8))[0]
    assert rows == 128 // (mesh["data"] * mesh["fsdp"])
    assert report.memory["arguments"] >= report.state_bytes["parameters"] > 0


SPLASH = {   # family: lengths of 128-token blocks, no attention dropout
    "gpt": ["--gin.TASK_FEATURE_LENGTHS={'targets': 128}"],
    "bert": ["--gin.TASK_FEATURE_LENGTHS={'inputs': 128, 'max_predictions': 4}"],
    "t5": ["--gin.TASK_FEATURE_LENGTHS={'inputs': 128, 'targets': 128}"],
}


@needs_libtpu
@pytest.mark.parametrize("family", sweep(["gpt", "bert", "t5"], ci={"gpt"}))
def test_the_splash_kernel_compiles_for_v5e(family, caplog):
    """attention_kernel='auto' on a TPU slice: the Pallas splash kernel (a Mosaic custom
    call in the compiled step); T5's self-attention keeps XLA for its relative bias."""
    attention_kernels._fall_back.cache_clear()           # it logs each reason once
    with caplog.at_level("INFO", logger="t2t.nn.attention_kernels"):
        report = _compile(family, "tpu_v5e_8", "--gin.BATCH_SIZE=16",
                          "--gin.TransformerConfig.dropout_rate=0.0", *SPLASH[family])
    assert report.fits and 'custom_call_target="tpu_custom_call"' in report.compiled.as_text()
    assert ("relative position bias" in caplog.text) == (family == "t5")


CRASH = ["models/gpt2/small.gin", "objectives/causal_lm.gin", "runs/pretrain_gpt.gin",
         "hardware/tpu_v4_8.gin", "--gin.CORPUS=c4", "--gin.BATCH_SIZE=8",
         "--gin.TransformerConfig.num_decoder_layers=2", "--gin.TransformerConfig.vocab_size=50304",
         "--gin.experiment.vocab_size_from_task=False"]


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("libtpu_flags, exit_code", [("", -11),
                                                    ("--xla_jf_conv_input_fusion=false", 0)])
def test_the_libtpu_crash_and_its_workaround(libtpu_flags, exit_code):
    """The smallest crash found (docs/notes/2026-11-tpu-compile.md): GPT-2 small's widths, 2 scanned layers, bfloat16,
    batch 8 x 1024 on v4-8 -- SIGSEGV in libtpu 0.0.42.1 (float32 or unscanned compile); it
    compiles without libtpu's producer fusion into matmul inputs. When a libtpu upgrade makes
    the first case compile, drop the workaround (benchmarks/compile_table.py)."""
    import os
    import subprocess
    import sys
    args = [f"--gin_file={a}" if not a.startswith("--") else a for a in CRASH]
    env = {**os.environ, "LIBTPU_INIT_ARGS": libtpu_flags}
    proc = subprocess.run([sys.executable, "-m", "t2t.cli", "compile", *args],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == exit_code, proc.stderr[-2000:]


@needs_libtpu
def test_t5_decoding_compiles_with_the_training_shardings():
    """--step=decode: `model.predict` (encode once, then the KV cache) for the training
    batch, parameters sharded as in training, no optimizer state."""
    report = _compile("t5", "tpu_v5e_8", step="decode")
    out = report.lines()
    assert out[0].startswith("decode step of t5") and VERDICT.match(out[-1]) and report.fits
    assert report.state_bytes["optimizer_state"] == 0 < report.state_bytes["parameters"]
    assert any("not counted (decoding loops one token at a time" in l for l in out)
    devices = chips.topology_devices(chips.parse("v5e-8"))
    with partitioning.target_devices(devices):       # the training step's shardings
        exp, batch = aot.build("train")
    exp.trainer.abstract_init(batch)
    spec = lambda tree: jax.tree.map(lambda s: s.spec, tree)  # noqa: E731
    assert spec(report.compiled.input_shardings[0][0]) == spec(
        exp.trainer.state_shardings.params)


@needs_libtpu
def test_decoding_an_encoder_is_one_line(capsys):
    code, out, err = _run(capsys, _args("bert", "tpu_v5e_8", "--step=decode"))
    assert code == 2 and out == []
    assert "--step=decode needs a family that decodes (t5, gpt); this config's is 'bert'" in err
