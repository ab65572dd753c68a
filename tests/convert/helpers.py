"""Shared by the parity tests."""
import torch


def perturb(model, scale=0.1):
    """HF inits biases to 0 and norms to 1; perturb every tensor so each one is checked."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
