"""Import and export Hugging Face checkpoints (safetensors only): the public names.

`load_pretrained(directory)` / `save_pretrained(model, directory)` serve every family by
config.json's `model_type` (`t2t.convert.pretrained`); `load_bert` / `save_bert`,
`load_t5` / `save_t5` and `load_gpt2` / `save_gpt2` give the plain (config, params) of one
family. Each family's converter is one module (`hf_bert`, `hf_t5`, `hf_gpt2`, `hf_gpt1`,
`hf_encoders` for RoBERTa, ALBERT, ELECTRA and DistilBERT, `hf_xlnet`) of rule tables on
the engine of `t2t.convert.rules`; the task heads of BERT and its successors map onto t2t's
fine-tuning heads through `hf_heads`. Trees are plain nested dicts of numpy arrays:

  BERT   -> `t2t.models.bert.BertModel(config)` params (pooler / heads only when present)
  T5     -> `t2t.nn.stacks.EncoderDecoder(config)` params
  GPT-2  -> `t2t.nn.stacks.Decoder(config)` params (the decoder-only LM)

Layers go under `layers/layer_{i}`, or stacked under `layers/layer` with a leading layer
axis when `config.scan_layers` (or `scan=True`). Pickle checkpoints (`*.bin`) are refused.
"""
from t2t.convert.hf_bert import (bert_config, bert_hf_config, bert_params_from_hf,
                                 bert_params_to_hf, load_bert, save_bert)
from t2t.convert.hf_files import (CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, read_json,
                                  read_safetensors)
from t2t.convert.hf_gpt2 import (gpt2_config, gpt2_hf_config, gpt2_params_from_hf,
                                 gpt2_params_to_hf, load_gpt2, save_gpt2)
from t2t.convert.hf_t5 import (load_t5, save_t5, t5_config, t5_hf_config, t5_params_from_hf,
                               t5_params_to_hf)
from t2t.convert.pretrained import load_pretrained, save_pretrained
from t2t.convert.rules import CheckpointMismatchError, Params, StateDict

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "WEIGHTS_INDEX_FILE", "CheckpointMismatchError",
           "Params", "StateDict", "bert_config", "bert_hf_config", "bert_params_from_hf",
           "bert_params_to_hf", "gpt2_config", "gpt2_hf_config", "gpt2_params_from_hf",
           "gpt2_params_to_hf", "load_bert", "load_gpt2", "load_pretrained", "load_t5",
           "read_json", "read_safetensors", "save_bert", "save_gpt2", "save_pretrained",
           "save_t5", "t5_config", "t5_hf_config", "t5_params_from_hf", "t5_params_to_hf"]
