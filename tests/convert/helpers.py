"""Shared by the parity tests."""
import torch

V, L = 96, 24
BERTISH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               initializer_range=0.2, max_position_embeddings=40)


def tiny_configs():
    """Family -> a function building its tiny transformers config (2 layers, width 32,
    vocabulary V, no dropout)."""
    import transformers as t
    return {
        "bert": lambda: t.BertConfig(vocab_size=V, **BERTISH),
        "roberta": lambda: t.RobertaConfig(vocab_size=V, type_vocab_size=1, pad_token_id=1,
                                           **dict(BERTISH, max_position_embeddings=L + 2)),
        "albert": lambda: t.AlbertConfig(vocab_size=V, embedding_size=16,
                                         classifier_dropout_prob=0.0, **BERTISH),
        "electra": lambda: t.ElectraConfig(vocab_size=V, embedding_size=16, **BERTISH),
        "big_bird": lambda: t.BigBirdConfig(vocab_size=V, attention_type="original_full",
                                            **BERTISH),
        "distilbert": lambda: t.DistilBertConfig(
            vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64, dropout=0.0,
            attention_dropout=0.0, max_position_embeddings=40, initializer_range=0.2),
        "gpt1": lambda: t.OpenAIGPTConfig(vocab_size=V, n_positions=40, n_embd=32, n_layer=2,
                                          n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0, initializer_range=0.2),
        "gpt2": lambda: t.GPT2Config(vocab_size=V, n_positions=40, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     initializer_range=0.2),
        # T5.1.1-style: gated GeLU, untied (T5Model / T5EncoderModel have no LM head)
        "t5": lambda: t.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                 num_heads=4, dropout_rate=0.0, feed_forward_proj="gated-gelu",
                                 tie_word_embeddings=False, relative_attention_num_buckets=8,
                                 relative_attention_max_distance=16),
        "xlnet": lambda: t.XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=4,
                                       d_inner=64, dropout=0.0, initializer_range=0.2),
    }


def perturb(model, scale=0.1):
    """HF inits biases to 0 and norms to 1; perturb every tensor so each one is checked."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def padded_batch(low, high, length, pad_id, ends=(None, 17, 5)):
    """Three rows of random ids in [low, high), row i real up to ends[i] then `pad_id`:
    (ids [3, length] int64, attention mask [3, length])."""
    import numpy as np
    ids = np.random.RandomState(0).randint(low, high, (3, length)).astype(np.int64)
    mask = np.ones_like(ids)
    for row, end in enumerate(ends):
        mask[row, end:] = 0 if end is not None else 1
    return np.where(mask == 1, ids, pad_id), mask


def hf_logits(model, ids, mask, **inputs):
    """A transformers model's logits (`prediction_logits` for *ForPreTraining) as numpy."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    **{k: torch.tensor(v) for k, v in inputs.items()})
    return out.logits.numpy() if hasattr(out, "logits") else out.prediction_logits.numpy()
