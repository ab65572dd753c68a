"""Weight conversion between t2t and other libraries (Hugging Face via safetensors)."""
from t2t.convert.hf import (CheckpointMismatchError, bert_config, bert_params_from_hf,
                            gpt2_config, gpt2_params_from_hf, load_bert, load_gpt2, load_t5,
                            save_bert, save_gpt2, save_t5, t5_config, t5_params_from_hf)

__all__ = ["CheckpointMismatchError", "bert_config", "bert_params_from_hf", "gpt2_config",
           "gpt2_params_from_hf", "load_bert", "load_gpt2", "load_t5", "save_bert",
           "save_gpt2", "save_t5", "t5_config", "t5_params_from_hf"]
