"""Shared by the parity tests."""
import torch


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
