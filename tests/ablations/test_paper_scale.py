"""The `paper` (and `small`) scales, validated on CPU: every cell's paper config is built
and its train step compiled and run for two steps at a test-sized model shape on mock TFDS
data (only the sizes, mesh and step counts are overridden; objectives, converters,
architectures, schedules, dtype and scanning are the paper's)."""
import tensorflow_datasets as tfds
import pytest

from t2t.ablations import grid as grid_lib, runner
from t2t.data.catalog.bible import bible_sentencepiece

from tests.tiers import sweep

SHAPE = ["TransformerConfig.d_model = 32", "TransformerConfig.d_ff = 64",
         "TransformerConfig.num_heads = 2", "TransformerConfig.head_dim = 16",
         "NUM_LAYERS = 2", "HALF_LAYERS = 1",
         "MeshConfig.data = -1", "MeshConfig.fsdp = 1", "MeshConfig.tensor = 1",
         "BATCH_SIZE = 8", "TrainConfig.log_every = 1", "TrainConfig.progress_bar = False",
         "TrainConfig.async_checkpoint = False", "TrainConfig.measure_peak = False"]
T5_TEST = SHAPE + ["T5_PAPER_PRETRAIN_STEPS = 2", "T5_PAPER_FINETUNE_STEPS = 2",
                   "T5_SMALL_PRETRAIN_STEPS = 2", "T5_SMALL_FINETUNE_STEPS = 2",
                    "DENOISING_LENGTHS = {'inputs': 32, 'targets': 16}",
                    "CORRUPTION_10_LENGTHS = {'inputs': 32, 'targets': 16}",
                    "CORRUPTION_25_LENGTHS = {'inputs': 32, 'targets': 24}",
                    "CORRUPTION_50_LENGTHS = {'inputs': 32, 'targets': 32}",
                    "SPAN_LENGTHS = {'inputs': 32, 'targets': 16}",
                    "FULL_TARGET_LENGTHS = {'inputs': 32, 'targets': 32}",
                    "LM_LENGTHS = {'inputs': 16, 'targets': 16}",
                    "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}"]
T5_GRIDS = [f"configs/ablations/t5_table{n}.gin" for n in (2, 4, 5, 6, 7)]
T5_CELLS = [(g, c.key) for g in T5_GRIDS
            for c in grid_lib.load_grid(g, "paper", ["T5_VOCABULARY = 'unused'"]).cells]
# + table 2's enc_dec_shared in the fine-tuning test; the rest -m slow
CI_CELLS = {("configs/ablations/t5_table2.gin", "lm-language_model")}


def _t5_grid(path="configs/ablations/t5_table2.gin", scale="paper"):
    vocab = bible_sentencepiece().model_file     # a local SentencePiece stands in for T5's
    return grid_lib.load_grid(path, scale, T5_TEST + [f"T5_VOCABULARY = {vocab!r}"])


@pytest.mark.parametrize("path,key", sweep(T5_CELLS, ci=CI_CELLS))
def test_t5_paper_cell_pretrains_on_mock_c4(path, key, tmp_path):
    grid = _t5_grid(path)
    (cell,) = [c for c in grid.cells if c.key == key]
    with tfds.testing.mock_data(num_examples=16):
        stage, _ = runner.pretrain(grid, cell, 0, str(tmp_path / "pretrain"))
    assert stage["stopped_by"] == "done" and stage["steps"] == 2
    assert stage["family"] == ("gpt" if "MODEL_FAMILY = 'gpt'" in cell.pretrain else "t5")


@pytest.mark.slow    # 36 s cold on 2 cores; CI runs a T5 paper cell's pretraining and BERT's
def test_t5_paper_fine_tuning_runs_on_mock_glue(tmp_path):   # paper fine-tunings on mock GLUE
    """MNLI also checks the per-task dev split (validation_matched)."""
    grid = _t5_grid()
    cell = grid.select(["denoising-enc_dec_shared"])[0]
    with tfds.testing.mock_data(num_examples=16):
        runner.pretrain(grid, cell, 0, str(tmp_path / "pretrain"))
        stage = runner.finetune(grid, cell, 0, "glue_mnli", str(tmp_path / "pretrain"),
                                str(tmp_path / "mnli"))
    assert stage["steps"] == 2 and stage["split"] == "validation_matched"
    assert 0.0 <= stage["metrics"]["accuracy"] <= 100.0


BERT_TEST = SHAPE[4:] + ["PAPER_LAYERS = 2", "PAPER_HIDDEN = 32", "PAPER_HEADS = 2",
                          "PAPER_HEAD_DIM = 16", "PAPER_FF = 64", "BERT_PAPER_PRETRAIN_STEPS = 2",
                         "BERT_SMALL_PRETRAIN_STEPS = 2",
                          "WARMUP_STEPS = 1", "MAX_LENGTH = 32"]
BERT_GRIDS = ("configs/ablations/bert_table5.gin", "configs/ablations/bert_table6.gin")
BERT_CELLS = [(g, c.key) for g in BERT_GRIDS
              for c in grid_lib.load_grid(g, "paper", ["BERT_VOCABULARY = 'unused'"]).cells]
BERT_CI = [(g, k) for g, k in BERT_CELLS if k == "l1_h128_a4"]  # + ltr_bilstm in the fine-tuning test


def _bert_grid(path, scale="paper"):
    from t2t.data.catalog.bible import bible_wordpiece
    vocab = bible_wordpiece().vocab_file        # a local WordPiece stands in for BERT's
    return grid_lib.load_grid(path, scale, BERT_TEST + [f"BERT_VOCABULARY = {vocab!r}"])


@pytest.mark.parametrize("path,key", sweep(BERT_CELLS, ci=BERT_CI))
def test_bert_paper_cell_pretrains_on_mock_wikipedia(path, key, tmp_path, monkeypatch):
    from t2t.data.catalog import paper
    monkeypatch.setattr(paper, "WIKIPEDIA_HELDOUT", 0.25)   # 16 mock articles: hold out ~4
    grid = _bert_grid(path)
    (cell,) = [c for c in grid.cells if c.key == key]
    with tfds.testing.mock_data(num_examples=16):
        stage, _ = runner.pretrain(grid, cell, 0, str(tmp_path / "pretrain"))
    assert stage["stopped_by"] == "done" and stage["steps"] == 2 and stage["family"] == "bert"
    if grid.scale.heldout:   # Table 6's held-out masked-LM loss
        assert stage["heldout"]["task"] == "wikipedia_mlm_nsp_validation"
        assert stage["heldout"]["mlm_loss"] > 0


@pytest.mark.slow    # ~13 s; in CI: T5's paper-scale fine-tuning on mock GLUE, the BiLSTM
# classifier head in tests/models/test_classifiers.py
def test_bert_paper_bilstm_fine_tuning_runs_on_mock_mrpc(tmp_path):
    grid = _bert_grid("configs/ablations/bert_table5.gin")
    cell = grid.select(["ltr_bilstm"])[0]
    with tfds.testing.mock_data(num_examples=16):
        runner.pretrain(grid, cell, 0, str(tmp_path / "pretrain"))
        stage = runner.finetune(grid, cell, 0, "glue_mrpc", str(tmp_path / "pretrain"),
                                str(tmp_path / "mrpc"))
    assert stage["steps"] >= 2 and 0.0 <= stage["metrics"]["accuracy"] <= 100.0  # 3 epochs


@pytest.mark.slow    # ~17 s; CI runs a paper-scale T5 cell
def test_small_scale_is_the_paper_recipe_shortened_on_one_gpu_host(tmp_path):
    """`small` keeps the paper's model, data, objective and lengths; only the steps, the
    hardware and the downstream set differ. A T5 cell pretrains and fine-tunes on mock data."""
    paper = _t5_grid("configs/ablations/t5_table7.gin")
    small = _t5_grid("configs/ablations/t5_table7.gin", "small")
    assert "hardware/gpu.gin" in small.scale.pretrain
    assert set(dict(small.scale.tasks)) < set(dict(paper.scale.tasks))
    cell = small.select(["span_3"])[0]
    assert cell.pretrain == paper.select(["span_3"])[0].pretrain
    with tfds.testing.mock_data(num_examples=16):
        stage, _ = runner.pretrain(small, cell, 0, str(tmp_path / "pretrain"))
        tuned = runner.finetune(small, cell, 0, "glue_rte", str(tmp_path / "pretrain"),
                                str(tmp_path / "rte"))
    assert stage["steps"] == 2 and stage["family"] == "t5" and tuned["steps"] == 2
    assert 0.0 <= tuned["metrics"]["accuracy"] <= 100.0


@pytest.mark.slow    # ~12 s; CI runs Table 6's paper-scale cell with its held-out loss
def test_bert_small_scale_pretrains_with_heldout_perplexity(tmp_path, monkeypatch):
    from t2t.data.catalog import paper
    monkeypatch.setattr(paper, "WIKIPEDIA_HELDOUT", 0.25)
    grid = _bert_grid("configs/ablations/bert_table6.gin", "small")
    assert dict(grid.scale.tasks) == {"glue_mnli": "accuracy", "glue_mrpc": "accuracy",
                                      "glue_sst2": "accuracy"}
    cell = grid.select(["l4_h128_a4"])[0]   # 12/768/12 at the paper's size (PAPER_* rows)
    with tfds.testing.mock_data(num_examples=16):
        stage, _ = runner.pretrain(grid, cell, 0, str(tmp_path / "pretrain"))
    assert stage["steps"] == 2 and stage["heldout"]["mlm_loss"] > 0


@pytest.mark.slow    # a BiLSTM under SQuAD's span head: tests/train/test_finetune.py
def test_bert_paper_squad_fine_tuning_runs_a_span_qa_with_the_bilstm(tmp_path):
    """Table 5's SQuAD column: the scale's task_finetune lines turn the fine-tuning into
    span QA (with the '+ BiLSTM' row's BiLSTM under the span head), scored by F1."""
    from tests.data.helpers import squad_records
    grid = _bert_grid("configs/ablations/bert_table5.gin")
    assert dict(grid.scale.tasks)["squad_v1_1"] == "f1"
    cell = grid.select(["ltr_bilstm"])[0]
    with tfds.testing.mock_data(num_examples=16):
        runner.pretrain(grid, cell, 0, str(tmp_path / "pretrain"))
    records = {"train": squad_records(8), "validation": squad_records(4, seed=1)}
    with tfds.testing.mock_data(as_data_source_fn=lambda _, split, *a, **k: records[str(split)]):
        stage = runner.finetune(grid, cell, 0, "squad_v1_1", str(tmp_path / "pretrain"),
                                str(tmp_path / "squad"))
    assert stage["steps"] >= 2 and set(stage["metrics"]) == {"em", "f1"}
    config = (tmp_path / "squad" / "config.gin").read_text()
    assert "span_qa_experiment.bilstm_units = %BERT_HIDDEN" in config
