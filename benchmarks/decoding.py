"""Decoding speed: t2t's KV-cache decoder vs Hugging Face `generate` (PyTorch), GPT-2 small.

Random GPT-2 small weights are created in torch and converted with
`t2t.convert.hf.gpt2_params_from_hf`, so both run the same model in float32. A 16-token
prompt, exactly 32 new tokens (no EOS stop), greedy and beam search (4 beams, length
penalty off for HF's default 1.0 / t2t alpha 0.6 does not change the work), batch 1 and
16. New tokens per second = batch x 32 / wall time of one whole decode call (compiled
beforehand for t2t; one warm-up call for torch). Timed interleaved, medians. Also
reported: the fraction of greedy tokens where t2t and HF agree (same model, same prompt).

    python benchmarks/decoding.py [--batches 1,16] [--rounds 3] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import _common  # noqa: E402

PROMPT, NEW = 16, 32


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,16")
    p.add_argument("--strategies", default="greedy,beam")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch
    import transformers as tr
    from t2t.convert import hf
    from t2t.models import decoding
    from t2t.models.gpt import DecoderOnlyModel

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    hf_cfg = tr.GPT2Config()
    net = tr.GPT2LMHeadModel(hf_cfg).eval()
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    cfg = hf.gpt2_config(hf_cfg.to_dict())
    params = jax.tree_util.tree_map(jnp.asarray, hf.gpt2_params_from_hf(state, cfg))
    model = DecoderOnlyModel(cfg)

    batches = [int(b) for b in args.batches.split(",")]
    strategies = args.strategies.split(",")
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(0, 50000, (b, PROMPT), dtype=np.int32) for b in batches}

    def t2t_fn(b, strategy):
        batch = {"decoder_input_tokens": jnp.asarray(prompts[b])}
        opts = {"beam_size": 4} if strategy == "beam" else {}

        def run():
            return np.asarray(decoding.decode(model, params, batch, max_decode_length=NEW,
                                              strategy=strategy, eos_id=None, **opts))
        return run

    def torch_fn(b, strategy):
        ids = torch.from_numpy(prompts[b]).long()
        kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                  num_beams=4 if strategy == "beam" else 1, pad_token_id=hf_cfg.eos_token_id,
                  attention_mask=torch.ones_like(ids))

        def run():
            with torch.inference_mode():
                return net.generate(ids, **kw)[:, PROMPT:].numpy()
        return run

    fns = {}
    for b in batches:
        for s in strategies:
            fns[f"t2t {s} b{b}"] = t2t_fn(b, s)
            fns[f"torch {s} b{b}"] = torch_fn(b, s)
    agree = {}
    for b in batches:
        if "greedy" in strategies:
            a, c = fns[f"t2t greedy b{b}"](), fns[f"torch greedy b{b}"]()
            agree[b] = float(np.mean(a == c))
    load0 = _common.loadavg()
    times = _common.interleaved(fns, args.rounds, warmup=1)
    rows = []
    for b in batches:
        for s in strategies:
            tt, to = (_common.median(times[f"{k} {s} b{b}"]) for k in ("t2t", "torch"))
            rows.append([f"{s}{'-4' if s == 'beam' else ''}", b, f"{b * NEW / tt:,.1f}",
                         f"{b * NEW / to:,.1f}", f"{to / tt:.2f}x",
                         f"{agree[b]:.3f}" if s == "greedy" and b in agree else "-"])
    table = _common.markdown_table(
        ["strategy", "batch", "t2t new tok/s", "torch generate new tok/s", "t2t / torch",
         "greedy tokens equal"], rows, "lrrrrr")
    print(table)
    if not args.no_write:
        body = (_common.machine_line("jax", "jaxlib", "flax", "torch", "transformers") +
                f"\nCommand: `python benchmarks/decoding.py --batches {args.batches} --strategies "
                f"{args.strategies} --rounds {args.rounds}`; GPT-2 small, random weights (torch "
                f"init, converted), float32, prompt {PROMPT}, {NEW} new tokens, no EOS stop; "
                f"median of {args.rounds} interleaved calls after a warm-up. Load average: "
                f"{load0} -> {_common.loadavg()}.\n\n" + table)
        _common.append_results("Decoding: t2t KV cache vs HF generate (torch), GPT-2 small", body)


if __name__ == "__main__":
    main()
