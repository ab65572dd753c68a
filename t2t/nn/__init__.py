"""Pure flax.linen Transformer modules with logical axis annotations."""
from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import Decoder, Encoder, EncoderDecoder, LayerStack

__all__ = ["TransformerConfig", "Encoder", "Decoder", "EncoderDecoder", "LayerStack"]
