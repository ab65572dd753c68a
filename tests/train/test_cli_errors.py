"""What a new user hits on the command line: every mistake is one line on stderr (exit 2)
before anything compiles, with the traceback only in the log or behind --verbose."""
import os

import jax
import jax.numpy as jnp
import pytest

from t2t import errors, platforms
from t2t.run import gin_utils
from t2t.cli import ERROR_LOG, main, read_input_lines
from t2t.train import checkpoints

T5 = ["train", "--gin_file=experiments/t5_tiny_bible.gin", "--gin_file=models/t5/1_1/test.gin"]


def _one_line_error(capsys) -> str:
    """The error line (progress lines such as "building the model" may come before it)."""
    err = capsys.readouterr().err.strip()
    errors_said = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors_said) == 1 and "Traceback" not in err, err
    assert err.splitlines()[-1] == errors_said[0]
    return errors_said[0]


def test_misspelt_macro_is_an_error_naming_the_nearest(tmp_path, capsys):
    assert main(T5 + [f"--gin.MODEL_DIR={tmp_path}/run", "--gin.TRAIN_STEPSS=5"]) == 2
    err = _one_line_error(capsys)
    assert "--gin.TRAIN_STEPSS is not used by this config" in err and "TRAIN_STEPS?" in err
    assert not (tmp_path / "run").exists()
    assert "TRAIN_STEPSS" in open(ERROR_LOG).read()      # the traceback went to the log


def test_an_unbound_macro_says_which_shipped_configs_bind_it(tmp_path, capsys):
    """runs/pretrain_bert.gin reads %OBJECTIVE; a model file without an objective leaves it
    unbound, which gin reports as a TypeError from deep inside its macro machinery."""
    argv = ["train", "--gin_file=runs/pretrain_bert.gin", "--gin_file=models/bert/test.gin",
            f"--gin.MODEL_DIR={tmp_path}/run"]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert "the config uses %OBJECTIVE but nothing binds it" in err
    assert "objectives/albert_ngram_sop.gin" in err and "--gin OBJECTIVE=..." in err
    assert not (tmp_path / "run").exists()
    assert gin_utils.unbound_macro(TypeError("missing 1 required positional argument")) is None


def test_unused_binding_check_accepts_every_used_macro():
    bindings = ["MODEL_DIR = '/tmp/x'", "TRAIN_STEPS = 3", "BATCH_SIZE = 2", "SEED = 1",
                "TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 4}",
                "TransformerConfig.d_model = 64"]
    gin_utils.parse(["experiments/t5_tiny_bible.gin"], bindings)
    gin_utils.check_bindings(bindings)   # all used: no error


def test_missing_model_dir_says_what_to_add(capsys):
    assert main(T5) == 2
    assert "MODEL_DIR is required and not set" in _one_line_error(capsys)


def test_warmup_longer_than_the_run_is_caught_with_the_config(tmp_path, capsys):
    argv = ["train", "--gin_file=experiments/gpt_tiny_bible.gin",
            "--gin_file=models/gpt2/test.gin", f"--gin.MODEL_DIR={tmp_path}",
            "--gin.TRAIN_STEPS=50"]                      # the cosine warm-up is 100 steps
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert "warmup_steps (100) <= total_steps (50)" in err and "TRAIN_STEPS" in err


def test_unknown_task_is_one_line(tmp_path, capsys):
    assert main(T5 + [f"--gin.MODEL_DIR={tmp_path}", "--gin.CORPUS=bibel_web"]) == 2
    assert "unknown task 'bibel_web_span_corruption'" in _one_line_error(capsys)


def _tree(names, shape=(4, 8)):
    return {n: jax.ShapeDtypeStruct(shape, jnp.float32) for n in names}


def test_checkpoint_mismatch_summary_counts_and_names_the_first_few():
    stored = {"params": _tree([f"layer_{i}" for i in range(10)] + ["token_embedder"])}
    target = {"params": _tree([f"layer_{i}" for i in range(10)])}
    target["params"]["token_embedder"] = jax.ShapeDtypeStruct((4, 16), jnp.float32)
    for i in range(5):
        target["params"][f"layer_{i}"] = jax.ShapeDtypeStruct((4, 9), jnp.float32)
    with pytest.raises(errors.CheckpointMismatchError) as e:
        checkpoints.check_compatible(stored, target, where="checkpoint /ck (step 7)")
    summary = e.value.summary
    assert "\n" not in summary
    assert summary.startswith("checkpoint /ck (step 7) does not fit the model: 6 of 11 "
                              "parameters differ (different model size or config?)")
    assert "first: params/layer_0: checkpoint (4, 8) vs model (4, 9); params/layer_1" in summary
    assert "d_model differs?" in e.value.details          # the full list, with hints
    assert e.value.details.count("\n  ") == 6


def test_checkpoint_of_another_family_says_so():
    with pytest.raises(errors.CheckpointMismatchError, match="different family"):
        checkpoints.check_compatible({"params": _tree(["encoder", "decoder"])},
                                     {"params": _tree(["bert_encoder"])})


def test_infer_input_must_be_utf8_and_not_empty(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("first line\nen été\n".encode("latin-1"))
    with pytest.raises(errors.InputFileError, match=r"latin1.txt, line 2: byte 0xe9 is not UTF-8"):
        read_input_lines(str(latin))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(errors.InputFileError, match="empty.txt is empty"):
        read_input_lines(str(empty))
    good = tmp_path / "good.txt"
    good.write_text("un\ndeux\n")
    assert read_input_lines(str(good)) == ["un", "deux"]


def test_infer_rejects_bad_input_before_loading_a_model(tmp_path, capsys):
    latin = tmp_path / "in.txt"
    latin.write_bytes(b"caf\xe9\n")
    argv = ["infer", "--gin_file=experiments/finetune_t5_tiny_bible_en_es.gin",
            f"--gin.MODEL_DIR={tmp_path}/none", f"--input={latin}"]
    assert main(argv) == 2
    assert "in.txt, line 1: byte 0xe9 is not UTF-8" in _one_line_error(capsys)


@pytest.mark.parametrize("environ,libtpu,want", [
    ({}, True, "cpu"),                                   # libtpu on a CPU host: stay quiet
    ({}, False, None),                                   # no libtpu: JAX's own choice
    ({"JAX_PLATFORMS": "cuda"}, True, None),             # the user's choice wins
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, True, None),   # a TPU VM: use the TPU
])
def test_default_platforms(monkeypatch, environ, libtpu, want):
    real = platforms.importlib.util.find_spec
    monkeypatch.setattr(platforms.importlib.util, "find_spec",
                        lambda name: (object() if libtpu else None) if name == "libtpu"
                        else (None if name.startswith("jax_cuda") else real(name)))
    monkeypatch.setattr(platforms.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(platforms.os.path, "isdir", lambda path: False)
    assert platforms.default_platforms(environ) == want


@pytest.mark.parametrize("environ,want", [
    ({}, os.path.expanduser("~/.cache/t2t/jax_cache")),              # the default
    ({"T2T_COMPILATION_CACHE": "/data/jax"}, "/data/jax"),            # moved
    ({"T2T_COMPILATION_CACHE": "off"}, None),                         # off
    ({"JAX_COMPILATION_CACHE_DIR": "/elsewhere"}, None),              # JAX's own setting wins
])
def test_compilation_cache_dir(environ, want):
    assert platforms.compilation_cache_dir(environ) == want


def test_enable_compilation_cache_keeps_a_configured_directory(monkeypatch, tmp_path):
    configured = jax.config.jax_compilation_cache_dir            # the suite's cache
    assert configured
    assert platforms.enable_compilation_cache() == configured
    assert jax.config.jax_compilation_cache_dir == configured
    monkeypatch.setenv("T2T_COMPILATION_CACHE", str(tmp_path))
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert platforms.enable_compilation_cache() == str(tmp_path)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    finally:
        jax.config.update("jax_compilation_cache_dir", configured)


def test_set_default_platforms_reaches_an_imported_jax(monkeypatch):
    """`python -m` tools import JAX before they choose platforms: the choice must still land
    in JAX's config, not only in the environment JAX read at import."""
    monkeypatch.setattr(platforms, "default_platforms", lambda: "cpu")
    monkeypatch.setenv("JAX_PLATFORMS", "")
    before = jax.config.jax_platforms
    try:
        jax.config.update("jax_platforms", None)
        platforms.set_default_platforms()
        assert jax.config.jax_platforms == "cpu" and os.environ["JAX_PLATFORMS"] == "cpu"
    finally:
        jax.config.update("jax_platforms", before)


def test_the_compilation_cache_is_pruned_least_recently_used_first(tmp_path):
    for i in range(5):                              # entry i last used at time 1000 + i
        entry = tmp_path / f"entry{i}-cache"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, (1000 + i, 1000 + i))
    assert platforms.prune_compilation_cache(str(tmp_path), 500) == 0    # 500 bytes fit
    os.utime(tmp_path / "entry0-cache", (2000, 1000))                    # entry0 read lately
    assert platforms.prune_compilation_cache(str(tmp_path), 250) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry0-cache", "entry4-cache"]
    assert platforms.prune_compilation_cache(str(tmp_path / "absent"), 0) == 0


@pytest.mark.parametrize("setting,want", [("", 4e9), ("0.5", 5e8), ("12", 12e9)])
def test_cache_max_bytes(setting, want):
    assert platforms.cache_max_bytes({"T2T_COMPILATION_CACHE_MAX_GB": setting}) == want


@pytest.mark.parametrize("setting", ["four", "inf", "nan", "-1"])
def test_cache_max_bytes_refuses_what_is_not_a_size(setting):
    with pytest.raises(errors.UserError, match="is not a number of gigabytes"):
        platforms.cache_max_bytes({"T2T_COMPILATION_CACHE_MAX_GB": setting})


def test_a_bad_cache_limit_is_one_line_before_anything_runs(monkeypatch, tmp_path, capsys):
    configured = jax.config.jax_compilation_cache_dir            # the suite's cache
    monkeypatch.setenv("T2T_COMPILATION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("T2T_COMPILATION_CACHE_MAX_GB", "four")
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert main(T5 + [f"--gin.MODEL_DIR={tmp_path}/run"]) == 2
    finally:
        jax.config.update("jax_compilation_cache_dir", configured)
    assert "T2T_COMPILATION_CACHE_MAX_GB='four' is not a number" in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_ablate_seeds_that_are_not_numbers_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["ablate", "configs/ablations/t5_table2.gin", "--scale=tiny", "--seeds", "0,x",
              "--list"])
    assert exit_.value.code == 2
    assert "argument --seeds: takes comma-separated whole numbers such as 0,1,2, got '0,x'" \
        in capsys.readouterr().err


def test_a_gin_value_gin_cannot_read_is_one_line_naming_the_binding(tmp_path, capsys):
    # `--gin NAME=value` is gin syntax as typed (`--gin.NAME=word` quotes a bare word itself)
    assert main(T5 + [f"--gin.MODEL_DIR={tmp_path}/run", "--gin", "CORPUS=bible_kjv"]) == 2
    err = _one_line_error(capsys)
    assert "--gin CORPUS=bible_kjv: Failed to parse token 'bible_kjv'; a string needs quotes" \
        in err
    bad = tmp_path / "bad.gin"
    bad.write_text("BATCH_SIZE = 16\nTRAIN_STEPS = 1 2\n")
    assert main(T5 + [f"--gin_file={bad}", f"--gin.MODEL_DIR={tmp_path}/run"]) == 2
    assert f"{bad}, line 2: Expected newline: TRAIN_STEPS = 1 2" in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_batch_of_no_rows_is_an_error_not_a_run_with_loss_zero(tmp_path, capsys):
    assert main(T5 + [f"--gin.MODEL_DIR={tmp_path}/run", "--gin.BATCH_SIZE=0"]) == 2
    assert "the batch size must be at least 1 row, got 0" in _one_line_error(capsys)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("binding, said", [
    ("--gin.TRAIN_STEPS=-5", "TrainConfig.train_steps (TRAIN_STEPS) must be at least 0, got -5"),
    ("--gin.TrainConfig.checkpoint_every=0", "TrainConfig.checkpoint_every must be at least 1"),
    ("--gin.TASK_FEATURE_LENGTHS={'inputs': 0, 'targets': 8}",
     "records in a row gave no example (counts so far: {}); do the feature lengths "
     "{'inputs': 0, 'targets': 8} fit this task?")])
def test_numbers_no_run_can_use_are_one_line(tmp_path, capsys, binding, said):
    assert main(T5 + [f"--gin.MODEL_DIR={tmp_path}/run", binding]) == 2
    assert said in _one_line_error(capsys)


def test_eval_of_a_pretraining_config_says_it_needs_a_fine_tuning_one(tmp_path, capsys):
    assert main(["eval", "--gin_file=experiments/t5_tiny_bible.gin",
                 f"--gin.MODEL_DIR={tmp_path}"]) == 2
    err = _one_line_error(capsys)
    assert "this is not a fine-tuning config (nothing binds INITIAL_CHECKPOINT)" in err


def test_a_misspelt_gin_file_names_the_nearest_shipped_ones(capsys):
    assert main(["params", "--gin_file=experiments/t5_tiny_bibel.gin"]) == 2
    err = _one_line_error(capsys)
    assert "gin file 'experiments/t5_tiny_bibel.gin' not found" in err
    assert "did you mean experiments/t5_tiny_bible.gin," in err
    assert main(["ablate", "configs/ablations/t5_tabel2.gin", "--scale=tiny", "--list"]) == 2
    assert "did you mean ablations/t5_table2.gin" in _one_line_error(capsys)


@pytest.mark.parametrize("error", [KeyError("x"), OSError(5, "Input/output error")])
def test_any_other_error_is_one_internal_error_line_with_the_traceback_in_the_log(
        tmp_path, monkeypatch, capsys, error):
    from t2t.run import experiment

    def broken():
        raise error

    monkeypatch.setattr(experiment, "run", broken)
    argv = T5 + [f"--gin.MODEL_DIR={tmp_path}/run"]
    assert main(argv) == errors.EXIT_INTERNAL == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    name = type(error).__name__
    assert err.startswith(f"t2t train: error: internal error: {name}: {error}"), err
    assert err.endswith(f"(details: {ERROR_LOG}, or rerun with --verbose)")
    log = open(ERROR_LOG).read()
    assert "Traceback" in log and "in broken" in log
    with pytest.raises(type(error)):                 # --verbose: raised as it is
        main(argv + ["--verbose"])


def test_t2t_data_reports_an_internal_error_in_one_line_too(monkeypatch, capsys):
    from t2t.data.catalog import builders

    def broken(*args, **kwargs):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(builders, "build", broken)
    assert main(["data", "build", "sotu"]) == errors.EXIT_INTERNAL
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"t2t data: error: internal error: ConnectionResetError: [Errno "
                                f"104] Connection reset by peer (details: {ERROR_LOG}, or rerun "
                                "with --verbose)"]


def test_t2t_launch_reports_an_internal_error_in_one_line_too(monkeypatch, capsys):
    """`t2t launch`'s own errors are LaunchError lines; anything else is one internal-error
    line, and --verbose (before `--`; after it, it belongs to the remote command) raises."""
    from t2t.launch import cli as launch_cli
    seen = []

    def broken(argv):
        seen.append(argv)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(launch_cli, "main", broken)
    argv = ["launch", "tpu", "--name", "x", "--", "t2t", "train", "--verbose"]
    assert main(argv) == errors.EXIT_INTERNAL
    assert capsys.readouterr().err.strip().splitlines() == [
        f"t2t launch: error: internal error: OSError: [Errno 5] Input/output error (details: "
        f"{ERROR_LOG}, or rerun with --verbose)"]
    with pytest.raises(OSError):
        main(["launch", "--verbose", "tpu", "--name", "x", "--", "t2t", "train"])
    assert seen == [argv[1:], ["tpu", "--name", "x", "--", "t2t", "train"]]
