"""Decoding speed: t2t's KV-cache decoder vs Hugging Face `generate` (PyTorch).

Models (`--model`): GPT-2 small (a 16-token prompt) and T5.1.1-small (a 128-token encoder
input; the decoder cross-attends to it every step). Random weights are created in torch
and converted with `t2t.convert.hf`, so both sides run the same model: in float32, or with
``--dtype bfloat16`` in bf16 (t2t: bf16 matmuls with float32 accumulation; torch:
``torch.autocast("cpu", dtype=torch.bfloat16)``); ``auto`` is what t2t picks on this
host. Exactly 32 new tokens (no EOS stop), greedy and beam search (4 beams; HF's length
penalty 1.0 vs t2t's alpha 0.6 does not change the work), batch 1 and 16. New tokens per
second = batch x 32 / wall time of one whole decode call (compiled beforehand for t2t; one
warm-up call for torch). Timed interleaved, medians. Also reported: the fraction of greedy
tokens where t2t and HF agree (same model, same input).

    python benchmarks/decoding.py [--model gpt2|t5] [--batches 1,16] [--rounds 3]
                                  [--dtype float32|bfloat16|auto] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import _common  # noqa: E402

NEW = 32
PROMPT = {"gpt2": 16, "t5": 128}          # prompt (GPT-2) or encoder input (T5) tokens
TITLE = {"gpt2": "GPT-2 small", "t5": "T5.1.1-small"}


def build(name: str, dtype: str = "float32"):
    """(torch model, t2t model, t2t params, HF pad id) with the same random weights; the
    t2t model computes in `dtype` (float32 params either way)."""
    import jax
    import jax.numpy as jnp
    import transformers as tr
    from t2t.convert import hf
    if name == "gpt2":
        from t2t.models.gpt import DecoderOnlyModel
        hf_cfg = tr.GPT2Config()
        net = tr.GPT2LMHeadModel(hf_cfg).eval()
        cfg = hf.gpt2_config(hf_cfg.to_dict())
        model_cls, to_params, pad = DecoderOnlyModel, hf.gpt2_params_from_hf, hf_cfg.eos_token_id
    else:
        from t2t.models.t5 import EncoderDecoderModel
        hf_cfg = tr.T5Config(d_model=512, d_ff=1024, d_kv=64, num_layers=8, num_heads=6,
                             feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                             vocab_size=32128, decoder_start_token_id=0)  # t5-v1_1-small
        net = tr.T5ForConditionalGeneration(hf_cfg).eval()
        cfg = hf.t5_config(hf_cfg.to_dict())
        model_cls, to_params, pad = EncoderDecoderModel, hf.t5_params_from_hf, hf_cfg.pad_token_id
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    params = jax.tree_util.tree_map(jnp.asarray, to_params(state, cfg))
    return net, model_cls(cfg.replace(dtype=dtype)), params, pad


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2", choices=sorted(PROMPT))
    p.add_argument("--batches", default="1,16")
    p.add_argument("--strategies", default="greedy,beam")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"],
                   help="t2t's matmul precision; bf16 runs torch under autocast too")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)

    import jax.numpy as jnp
    import torch
    from t2t.models import decoding

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    print(_common.machine_line("jax", "jaxlib", "torch", "transformers"), flush=True)
    net, model, params, pad_id = build(args.model, args.dtype)
    bf16 = model.config.dtype == "bfloat16"          # "auto" is resolved by now
    precision = ("bfloat16 (t2t: bf16 matmuls, float32 accumulation; torch: autocast)"
                 if bf16 else "float32")
    print(f"precision: {precision}", flush=True)
    encdec = args.model == "t5"
    prompt_len = PROMPT[args.model]

    batches = [int(b) for b in args.batches.split(",")]
    strategies = args.strategies.split(",")
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(2, 32000, (b, prompt_len), dtype=np.int32) for b in batches}

    def t2t_fn(b, strategy):
        batch = {("encoder_input_tokens" if encdec else "decoder_input_tokens"):
                 jnp.asarray(prompts[b])}
        opts = {"beam_size": 4} if strategy == "beam" else {}

        def run():
            return np.asarray(decoding.decode(model, params, batch, max_decode_length=NEW,
                                              strategy=strategy, eos_id=None, **opts))
        return run

    def torch_fn(b, strategy):
        ids = torch.from_numpy(prompts[b]).long()
        kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                  num_beams=4 if strategy == "beam" else 1, pad_token_id=pad_id,
                  attention_mask=torch.ones_like(ids))
        if encdec:
            kw["eos_token_id"] = None       # no EOS stop, as t2t's eos_id=None
        skip = 1 if encdec else prompt_len  # HF returns the start token / the prompt too

        def run():
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                return net.generate(ids, **kw)[:, skip:].numpy()
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
                f"\nCommand: `python benchmarks/decoding.py --model {args.model} --batches "
                f"{args.batches} --strategies {args.strategies} --rounds {args.rounds} "
                f"--dtype {args.dtype}`; {TITLE[args.model]}, random weights (torch init, "
                f"converted), float32 params, {precision}, "
                f"{'encoder input' if encdec else 'prompt'} {prompt_len}, {NEW} new tokens, "
                "no EOS stop; "
                f"median of {args.rounds} interleaved calls after a warm-up. Load average: "
                f"{load0} -> {_common.loadavg()}.\n\n" + table)
        _common.append_results(
            f"Decoding: t2t KV cache vs HF generate (torch), {TITLE[args.model]}", body)


if __name__ == "__main__":
    main()
