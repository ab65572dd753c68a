"""Train-step throughput: t2t vs Hugging Face Flax vs PyTorch, same config and shapes.

One full training step each (forward, backward, AdamW update), random weights, float32
parameters, on one CPU device. Implementations are warmed up (compiled) once, then timed
interleaved (A, B, C, A, B, C, ...) so the VM's drift hits all of them alike; medians.

  bert  BERT-base MLM+NSP, batch 8 x 128, 20 masked positions per sequence
        t2t: logits only at the masked positions; HF (BertForPreTraining): at all 128
  t5    T5.1.1-base span corruption, batch 2 x (512 inputs + 114 targets), no dropout
  gpt   GPT-2 small causal LM, batch 8 x 128
  --size micro (T5 only): the T5 1.0 model of the `micro` ablation scale (4+4 layers of
        d_model 256, ReLU, tied 16,128-entry vocabulary, dropout 0.1), batch 32 x (128 +
        64): the step the micro grids pretrain with (AdamW here, Adafactor there)

FLOPs: `t2t.train.flops.step_flops` for everyone (model FLOPs of t2t's step: BERT's MLM
logits counted at the 20 masked positions); each row's MFU is against the 2048^3 matmul
peak of its own precision (float32, or bf16 inputs with float32 accumulation), measured at
start-up (``--peak`` gives the ``--peak-dtype`` one instead). t2t variants (levers):
``t2t`` (float32), ``t2t_bf16`` (bfloat16 matmuls, float32 accumulation and params),
``t2t_auto`` (``dtype="auto"``: whichever of the two this host prefers),
``t2t_fused`` (``attention_kernel="cudnn"``), ``t2t_bf16_fused``, ``t2t_bf16_xla`` (XLA
attention), ``t2t_bf16_scan`` (``scan_layers=True``), ``t2t_nodropout``; the peers
have ``torch_bf16`` (``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward and
loss), ``hf_flax_nodropout`` and ``torch_nodropout`` (every dropout rate 0), against which
``t2t_nodropout`` rows are compared. HF Flax's BERT and GPT-2 draw one attention-dropout
mask per layer broadcast over batch and heads; t2t and torch draw one per element, as the
papers. The header records the CPU and its bf16 flags.

    python benchmarks/train_step.py [--models bert,t5,gpt]
                                    [--impls t2t,t2t_bf16,t2t_auto,hf_flax,torch,torch_bf16]
                                    [--rounds 3] [--no-write]
    # on a GPU (the issue's accelerator run): large models, bf16, MFU vs the bf16 peak;
    # benchmarks/gpu_step.sh runs the peers in their own process
    python benchmarks/train_step.py --models t5 --size large --batch 64 --impls t2t_bf16_scan
"""
from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import _common  # noqa: E402

BATCH = {"bert": dict(batch=8, length=128, masked=20),
         "t5": dict(batch=2, inputs=512, targets=114),
         "gpt": dict(batch=8, length=128)}
LR, WD = 1e-4, 0.01
SIZE = "base"   # "large" (--size): BERT-large, T5.1.1-large, GPT-2 large, e.g. on a GPU
LARGE = {"bert": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096),
         "t5": dict(d_model=1024, d_ff=2816, num_layers=24, num_heads=16),
         "gpt": dict(n_embd=1280, n_layer=36, n_head=20)}
MICRO = dict(vocab_size=16128, d_model=256, d_ff=1024, num_layers=4, num_heads=4,  # T5 only
             feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.1)
MICRO_BATCH = dict(batch=32, inputs=128, targets=64)


# ----------------------------------------------------------------------------- configs
def hf_config(model: str, dropout: bool = True):
    """The peers' config; `dropout=False` zeroes every dropout rate (T5 has none anyway)."""
    import transformers as tr
    size = {"large": LARGE[model], "micro": MICRO}.get(SIZE, {})
    if model == "bert":                                              # BERT-base
        rate = {} if dropout else dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return tr.BertConfig(**rate, **size)
    if model == "t5":                                                # T5.1.1-base
        base = dict(vocab_size=32128, d_model=768, d_ff=2048, num_layers=12, num_heads=12,
                    feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)
        return tr.T5Config(d_kv=64, **{**base, **size})
    if model == "gpt":                                               # GPT-2 small
        rate = {} if dropout else dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return tr.GPT2Config(**rate, **size)
    raise ValueError(model)


def t2t_config(model: str, **overrides):
    from t2t.convert import hf
    fn = {"bert": hf.bert_config, "t5": hf.t5_config, "gpt": hf.gpt2_config}[model]
    return fn(hf_config(model).to_dict()).replace(**overrides)


def make_batch(model: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    g = BATCH[model]
    if model == "bert":
        b, n, m = g["batch"], g["length"], g["masked"]
        tokens = rng.integers(1000, 30000, (b, n), dtype=np.int32)
        positions = np.stack([np.sort(rng.choice(np.arange(1, n), m, replace=False))
                              for _ in range(b)]).astype(np.int32)
        ids = np.take_along_axis(tokens, positions, 1)
        tokens[np.arange(b)[:, None], positions] = 103               # [MASK]
        tt = np.zeros((b, n), np.int32)
        tt[:, n // 2:] = 1
        return {"encoder_input_tokens": tokens, "token_type_ids": tt,
                "masked_positions": positions, "masked_ids": ids.astype(np.int32),
                "masked_weights": np.ones((b, m), np.float32),
                "next_sentence_labels": rng.integers(0, 2, (b,), dtype=np.int32)}
    if model == "t5":
        b, s, t = g["batch"], g["inputs"], g["targets"]
        vocab = 16000 if SIZE == "micro" else 32000
        targets = rng.integers(2, vocab, (b, t), dtype=np.int32)
        dec_in = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], 1)
        return {"encoder_input_tokens": rng.integers(2, vocab, (b, s), dtype=np.int32),
                "decoder_input_tokens": dec_in, "decoder_target_tokens": targets,
                "decoder_loss_weights": np.ones((b, t), np.float32)}
    b, n = g["batch"], g["length"]
    tokens = rng.integers(0, 50000, (b, n + 1), dtype=np.int32)
    return {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
            "decoder_loss_weights": np.ones((b, n), np.float32)}


def tokens_per_step(model: str) -> int:
    g = BATCH[model]
    return g["batch"] * (g["inputs"] + g["targets"] if model == "t5" else g["length"])


def step_flops(model: str) -> float:
    from t2t.train import flops
    g = BATCH[model]
    cfg = t2t_config(model)
    if model == "bert":
        return flops.step_flops(cfg, "bert", g["batch"], input_length=g["length"],
                                num_masked=g["masked"])
    if model == "t5":
        return flops.step_flops(cfg, "t5", g["batch"], input_length=g["inputs"],
                                target_length=g["targets"])
    return flops.step_flops(cfg, "gpt", g["batch"], target_length=g["length"])


# ----------------------------------------------------------------------------- t2t
def build_t2t(model: str, **overrides):
    import jax
    import optax
    from t2t.models.base import LossConfig
    from t2t.models.families import make_model
    from t2t.train.partitioning import MeshConfig, make_mesh
    from t2t.train.trainer import TrainConfig, Trainer

    cfg = t2t_config(model, **overrides)
    loss = LossConfig(z_loss=0.0) if model == "bert" else LossConfig()
    m = make_model(model, cfg, loss)
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    trainer = Trainer(m, optax.adamw(LR, weight_decay=WD), mesh,
                      TrainConfig(model_dir=tempfile.mkdtemp(), progress_bar=False))
    batch = make_batch(model)
    holder = {"state": trainer.init_state(batch)}

    def step():
        holder["state"], metrics = trainer.train_step(holder["state"], batch)
        jax.block_until_ready(metrics["loss"])
    return step, trainer


# ----------------------------------------------------------------------------- HF Flax
def _patch_flax_t5_clip():
    """HF Flax T5 (transformers 4.57) calls jnp.clip(a_max=...), gone in this JAX."""
    import jax.numpy as jnp
    import transformers.models.t5.modeling_flax_t5 as mod
    if getattr(mod.jnp, "_t2t_patched", False):
        return
    clip = jnp.clip

    def patched(x, min=None, max=None, *, a_min=None, a_max=None):
        return clip(x, a_min if min is None else min, a_max if max is None else max)
    proxy = types.SimpleNamespace(**{k: getattr(jnp, k) for k in dir(jnp)
                                     if not k.startswith("__")})
    proxy.clip, proxy._t2t_patched = patched, True
    mod.jnp = proxy


def build_hf_flax(model: str, dropout: bool = True):
    import jax
    import jax.numpy as jnp
    import optax
    import transformers as tr

    config = hf_config(model, dropout)
    batch = {k: jnp.asarray(v) for k, v in make_batch(model).items()}
    if model == "bert":
        net = tr.FlaxBertForPreTraining(config, seed=0)

        def loss_fn(params, rng):
            out = net(batch["encoder_input_tokens"], token_type_ids=batch["token_type_ids"],
                      params=params, dropout_rng=rng, train=True)
            logits = jnp.take_along_axis(out.prediction_logits,
                                         batch["masked_positions"][..., None], axis=1)
            mlm = optax.softmax_cross_entropy_with_integer_labels(logits, batch["masked_ids"])
            nsp = optax.softmax_cross_entropy_with_integer_labels(
                out.seq_relationship_logits, batch["next_sentence_labels"])
            return mlm.mean() + nsp.mean()
    elif model == "t5":
        _patch_flax_t5_clip()
        net = tr.FlaxT5ForConditionalGeneration(config, seed=0)

        def loss_fn(params, rng):
            logits = net(batch["encoder_input_tokens"],
                         decoder_input_ids=batch["decoder_input_tokens"], params=params,
                         dropout_rng=rng, train=True).logits
            return optax.softmax_cross_entropy_with_integer_labels(
                logits, batch["decoder_target_tokens"]).mean()
    else:
        net = tr.FlaxGPT2LMHeadModel(config, seed=0)

        def loss_fn(params, rng):
            logits = net(batch["decoder_input_tokens"], params=params, dropout_rng=rng,
                         train=True).logits
            return optax.softmax_cross_entropy_with_integer_labels(
                logits, batch["decoder_target_tokens"]).mean()

    tx = optax.adamw(LR, weight_decay=WD)

    def train_step(params, opt_state, rng):
        rng, sub = jax.random.split(rng)
        loss, grads = jax.value_and_grad(loss_fn)(params, sub)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rng, loss

    jitted = jax.jit(train_step, donate_argnums=(0, 1))     # as HF's run_*_flax examples
    params = net.params
    holder = {"s": (params, jax.jit(tx.init)(params), jax.random.PRNGKey(0))}

    def step():
        *state, loss = jitted(*holder["s"])
        holder["s"] = tuple(state)
        loss.block_until_ready()
    return step


# ----------------------------------------------------------------------------- torch
def build_torch(model: str, dropout: bool = True, bf16: bool = False):
    """`bf16`: forward and loss under torch.autocast(device, bfloat16), backward outside it
    (PyTorch's recipe); float32 params and AdamW either way. On CUDA when torch sees a
    GPU (its fused AdamW there), else on the CPU."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = hf_config(model, dropout)
    b = {k: (torch.from_numpy(np.asarray(v)).long() if v.dtype != np.float32
             else torch.from_numpy(v)).to(device) for k, v in make_batch(model).items()}
    if model == "bert":
        net = tr.BertForPreTraining(config)
        labels = torch.full_like(b["encoder_input_tokens"], -100)
        labels.scatter_(1, b["masked_positions"], b["masked_ids"])

        def loss_fn():
            return net(input_ids=b["encoder_input_tokens"], token_type_ids=b["token_type_ids"],
                       labels=labels, next_sentence_label=b["next_sentence_labels"]).loss
    elif model == "t5":
        net = tr.T5ForConditionalGeneration(config)

        def loss_fn():
            return net(input_ids=b["encoder_input_tokens"],
                       decoder_input_ids=b["decoder_input_tokens"],
                       labels=b["decoder_target_tokens"]).loss
    else:
        net = tr.GPT2LMHeadModel(config)
        ids = torch.cat([b["decoder_input_tokens"], b["decoder_target_tokens"][:, -1:]], 1)

        def loss_fn():
            logits = net(input_ids=ids[:, :-1]).logits
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                     ids[:, 1:].flatten())
    net.to(device).train()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD,
                            fused=device == "cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn()
        loss.backward()
        opt.step()
        float(loss.detach())
    return step


IMPLS = {
    "t2t": lambda m: build_t2t(m)[0],
    "t2t_bf16": lambda m: build_t2t(m, dtype="bfloat16")[0],
    "t2t_auto": lambda m: build_t2t(m, dtype="auto")[0],
    "t2t_fused": lambda m: build_t2t(m, attention_kernel="cudnn")[0],
    "t2t_bf16_fused": lambda m: build_t2t(m, dtype="bfloat16", attention_kernel="cudnn")[0],
    "t2t_bf16_xla": lambda m: build_t2t(m, dtype="bfloat16", attention_kernel="xla")[0],
    "t2t_bf16_scan": lambda m: build_t2t(m, dtype="bfloat16", scan_layers=True)[0],
    "t2t_nodropout": lambda m: build_t2t(m, dropout_rate=0.0, attention_dropout_rate=0.0)[0],
    "hf_flax": build_hf_flax,
    "hf_flax_nodropout": lambda m: build_hf_flax(m, dropout=False),
    "torch": build_torch,
    "torch_bf16": lambda m: build_torch(m, bf16=True),
    "torch_nodropout": lambda m: build_torch(m, dropout=False),
}
PEERS = ("torch", "torch_bf16", "hf_flax")   # the "vs" columns, those present in --impls


def matmul_dtype(impl: str) -> str:
    """The matmul input precision of an implementation (t2t_auto: what "auto" picks here)."""
    if impl == "t2t_auto":
        from t2t import precision
        return precision.resolve_dtype("auto")
    return "bfloat16" if "bf16" in impl else "float32"


SIZES = ("base", "large", "micro")


def set_size(parser, size: str, models: str) -> None:
    """SIZE = `size`; micro is T5's alone and brings its batch (a parser error otherwise)."""
    global SIZE
    if size == "micro":
        if models.split(",") != ["t5"]:
            parser.error(f"--size micro is a T5 model: pass --models t5, not {models!r}")
        BATCH["t5"].update(MICRO_BATCH)
    SIZE = size


def title(model: str) -> str:
    """e.g. 'BERT-base MLM+NSP 8x128 (20 masked)' for the current SIZE and BATCH."""
    g, large = BATCH[model], SIZE == "large"
    if model == "bert":
        return (f"BERT-{'large' if large else 'base'} MLM+NSP {g['batch']}x{g['length']} "
                f"({g['masked']} masked)")
    if model == "t5":
        name = "T5 1.0 micro" if SIZE == "micro" else f"T5.1.1-{'large' if large else 'base'}"
        return f"{name} {g['batch']}x({g['inputs']}+{g['targets']})"
    return f"GPT-2 {'large' if large else 'small'} {g['batch']}x{g['length']}"


def warmed_up(model: str, impls) -> dict:
    """{impl: step} built and run once each (compiled); an impl that fails to build or
    compile (out of memory at a large batch, a kernel this device lacks) is reported in one
    line and left out of the round rather than ending the run."""
    fns = {}
    for name in impls:
        t0 = time.perf_counter()
        try:
            fn = IMPLS[name](model)
            fn()
        except Exception as e:   # noqa: BLE001 - any failure drops the row, the run goes on
            first = (str(e).strip().splitlines() or [""])[0][:300]
            print(f"  {name}: failed, left out: {type(e).__name__}: {first}", flush=True)
            gc.collect()
            continue
        fns[name] = fn
        print(f"  warm-up {name}: {time.perf_counter() - t0:.1f} s (load "
              f"{_common.loadavg()})", flush=True)
    return fns


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert,t5,gpt")
    p.add_argument("--impls", default="t2t,t2t_bf16,hf_flax,torch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--peak", type=float, default=None, help="GFLOP/s (else measured)")
    p.add_argument("--peak-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the precision --peak is for (each row's MFU is against its own)")
    p.add_argument("--size", default="base", choices=SIZES)
    p.add_argument("--batch", type=int, default=None, help="rows per step (default: CPU's)")
    p.add_argument("--settle", type=int, default=0,
                   help="untimed steps of an implementation before each timed one")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    set_size(p, args.size, args.models)
    if args.batch:
        for g in BATCH.values():
            g["batch"] = args.batch

    import jax
    from t2t.train import flops

    if any(name.startswith("torch") for name in args.impls.split(",")):
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
    on_cpu = jax.devices()[0].platform == "cpu"
    peak_size = 2048 if on_cpu else 8192          # a 2048^3 product is too small for a GPU
    impls = args.impls.split(",")
    print(_common.machine_line("jax", "jaxlib", "torch", "transformers"), flush=True)
    dtypes = {name: matmul_dtype(name) for name in impls}
    if "t2t_auto" in impls:
        from t2t import precision
        print(f"t2t_auto: {precision.auto_choice().describe()}", flush=True)
    # Each row's MFU is against the matmul peak of its own precision, measured here.
    peaks = {d: (args.peak * 1e9 if args.peak and d == args.peak_dtype
                 else flops.measure_peak_flops(d, size=peak_size))
             for d in sorted(set(dtypes.values()) | {args.peak_dtype})}
    peak_text = ", ".join(f"{d} {p / 1e9:.0f}" for d, p in peaks.items())
    print(f"matmul peaks (GFLOP/s): {peak_text} on {jax.devices()[0].device_kind}; "
          f"load {_common.loadavg()}", flush=True)
    peers = [k for k in PEERS if k in impls]
    rows, loads = [], [_common.loadavg()]
    for model in args.models.split(","):
        print(f"== {model}", flush=True)
        fns = warmed_up(model, impls)
        cpu: dict = {}
        times = _common.interleaved(fns, args.rounds, warmup=0, settle=args.settle,
                                    log=lambda s: print(s, flush=True), cpu=cpu)
        loads.append(_common.loadavg())
        f = step_flops(model)
        ntok = tokens_per_step(model)
        med = {k: _common.median(v) for k, v in times.items()}
        for name in fns:
            # A *_nodropout row is compared with the peers' *_nodropout rows when present.
            suffix = "_nodropout" if name.endswith("_nodropout") else ""
            base = {k: med.get(k + suffix, med.get(k)) for k in peers}
            t = med[name]
            rows.append([title(model), name, "bf16" if dtypes[name] == "bfloat16" else "f32",
                         f"{t * 1e3:,.0f}", f"{ntok / t:,.0f}", f"{f / t / 1e9:,.0f}",
                         f"{100 * f / t / peaks[dtypes[name]]:.0f}%",
                         f"{_common.median(cpu[name]) / t:.2f}",
                         *("–" if base[k] is None else f"{base[k] / t:.2f}x" for k in peers)])
        del fns
        gc.collect()
    header = ["model", "impl", "matmuls", "step ms (median)", "tokens/s", "model GFLOP/s",
              "MFU", "cores busy", *(f"vs {k}" for k in peers)]
    table = _common.markdown_table(header, rows, "lll" + "r" * (len(header) - 3))
    print(table)
    if not args.no_write:
        body = (_common.machine_line("jax", "jaxlib", "flax", "optax", "torch", "transformers")
                + f" Device: {jax.devices()[0].device_kind}."
                + "\nCommand: `python benchmarks/train_step.py "
                + shlex.join(sys.argv[1:] if argv is None else argv)
                + f"`. Median of {args.rounds} "
                f"interleaved steps after 1 warm-up"
                + (f", each after {args.settle} untimed step(s) of the same implementation"
                   if args.settle else "")
                + "; float32 params, AdamW; `matmuls`: the "
                f"matmul input precision (bf16: float32 accumulation; torch_bf16: autocast); "
                f"MFU of each row vs the {peak_size}^3 matmul peak of its precision, "
                f"GFLOP/s: {peak_text}"
                + (f" ({args.peak_dtype} given)" if args.peak else " (measured in this run)")
                + "; model FLOPs from "
                f"`t2t.train.flops.step_flops` (BERT: MLM logits at the 20 masked positions); "
                f"`cores busy`: median process CPU seconds per median wall second of a step. "
                f"Load average (1/5/15 min) during the run: {' -> '.join(loads)}.\n\n" + table)
        _common.append_results("Train step: t2t vs HF Flax vs PyTorch", body)


if __name__ == "__main__":
    main()
