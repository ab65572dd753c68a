"""t2t: encoder (BERT), decoder (GPT) and encoder-decoder (T5) Transformers in JAX/Flax."""

__version__ = "0.1.0"
