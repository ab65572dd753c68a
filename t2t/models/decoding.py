"""Autoregressive decoding on the KV cache: greedy, sampling (temperature, top-k, top-p) and
beam search, each one jitted `lax.while_loop` that stops once every sequence has emitted EOS.

Two layers:

* strategies over an abstract step function: `greedy`, `sample`, `beam_search` take
  `logits_fn(tokens [B], cache, i) -> (logits [B, vocab], cache)`, which feeds the token
  chosen at step `i - 1` and returns the logits for step `i`, plus the logits of step 0
  and the cache after the prompt;
* `decode(model, params, batch, ...)`, which builds that step function for an
  `EncoderDecoderModel` (encode once; the decoder starts from the config's
  `decoder_start_id`, T5 0 and BART 2, and cross-attends the encoded inputs every step)
  or a `DecoderOnlyModel` (one prefill call over the prompt, prefix-LM mask included,
  then generation after it).

Finished sequences emit pad (0) after their EOS. Decoder-only prompts are left-padded to a
common width inside `decode`, so that every example's generation starts at the same cache
slot; per-example positions and a padding mask keep the results equal to running each
example alone.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from t2t.models import families
from t2t.nn.stacks import EncoderDecoder

Cache = Any
# (tokens chosen at step i-1 [B], cache, i) -> (logits for step i [B, vocab], cache)
LogitsFn = Callable[[jax.Array, Cache, jax.Array], Tuple[jax.Array, Cache]]
STRATEGIES = ("greedy", "sample", "beam")
NEG_INF = -jnp.inf


class DecodeOutput(NamedTuple):
    tokens: jax.Array      # [batch, max_decode_length] int32, pad (0) after EOS
    steps: jax.Array       # [] int32: positions decoded before the loop stopped


class BeamOutput(NamedTuple):
    tokens: jax.Array      # [batch, max_decode_length]: the best beam
    beams: jax.Array       # [batch, beam, max_decode_length], best first
    scores: jax.Array      # [batch, beam] length-penalized log-probabilities
    steps: jax.Array       # [] int32


# ------------------------------------------------------------------ logits filters
def top_k_filter(logits: jax.Array, k: Union[int, jax.Array]) -> jax.Array:
    """Keep the k largest logits of the last axis (ties at the k-th value kept), others
    -inf; k <= 0 keeps all. k may be traced (one compiled loop for every k)."""
    vocab = logits.shape[-1]
    if isinstance(k, int):
        if k <= 0 or k >= vocab:
            return logits
        kth = lax.top_k(logits, k)[0][..., -1:]                    # [..., 1]
    else:
        descending = -jnp.sort(-logits, axis=-1)
        kth = jnp.take(descending, jnp.clip(k - 1, 0, vocab - 1), axis=-1)[..., None]
        kth = jnp.where(k > 0, kth, NEG_INF)
    return jnp.where(logits >= kth, logits, NEG_INF)


def top_p_filter(logits: jax.Array, p: Union[float, jax.Array]) -> jax.Array:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass is >= p.

    A token is kept when the mass of the tokens sorted before it is < p (so the top token
    is always kept); tokens tied with the last kept one are kept too. p >= 1 keeps all.
    """
    if isinstance(p, (int, float)) and p >= 1.0:
        return logits
    descending = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(descending.astype(jnp.float32), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = (mass_before < p) | (p >= 1.0)
    cutoff = jnp.min(jnp.where(keep, descending, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= cutoff, logits, NEG_INF)


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT / T5 brevity penalty ((5 + length) / 6) ** alpha."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# --------------------------------------------------------------- greedy / sampling
def _sampling_loop(logits_fn: LogitsFn, first_logits: jax.Array, cache: Cache,
                   choose: Callable[[jax.Array, jax.Array], jax.Array], max_decode_length: int,
                   eos_id: Optional[int]) -> DecodeOutput:
    """One token per sequence per step; `choose(logits [B, V] f32, i) -> tokens [B]`."""
    batch = first_logits.shape[0]

    def advance(state, logits):
        i, tokens, finished, cache, _ = state
        new = jnp.where(finished, 0, choose(logits.astype(jnp.float32), i)).astype(jnp.int32)
        tokens = lax.dynamic_update_slice(tokens, new[:, None], (0, i))
        if eos_id is not None:
            finished = finished | (new == eos_id)
        return i + 1, tokens, finished, cache, new

    state = (jnp.int32(0), jnp.zeros((batch, max_decode_length), jnp.int32),
             jnp.zeros((batch,), bool), cache, jnp.zeros((batch,), jnp.int32))
    state = advance(state, first_logits)

    def cond(state):
        return (state[0] < max_decode_length) & ~jnp.all(state[2])

    def body(state):
        i, _, _, cache, last = state
        logits, cache = logits_fn(last, cache, i)
        return advance(state[:3] + (cache, last), logits)

    i, tokens, _, _, _ = lax.while_loop(cond, body, state)
    return DecodeOutput(tokens, i)


def greedy(logits_fn: LogitsFn, first_logits: jax.Array, cache: Cache, *,
           max_decode_length: int, eos_id: Optional[int] = 1) -> DecodeOutput:
    """Argmax decoding. first_logits [B, V] are the logits of step 0."""
    return _sampling_loop(logits_fn, first_logits, cache,
                          lambda logits, i: jnp.argmax(logits, axis=-1),
                          max_decode_length, eos_id)


def sample(logits_fn: LogitsFn, first_logits: jax.Array, cache: Cache, rng: jax.Array, *,
           max_decode_length: int, eos_id: Optional[int] = 1, temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0) -> DecodeOutput:
    """Ancestral sampling from softmax(logits / temperature), optionally top-k and/or
    nucleus (top-p) filtered; step i uses `fold_in(rng, i)`. temperature 0 is greedy.
    The options (and eos_id) may be traced values."""
    def choose(logits, i):
        t = jnp.asarray(temperature, jnp.float32)
        scaled = top_p_filter(top_k_filter(logits / jnp.where(t > 0, t, 1.0), top_k), top_p)
        drawn = jax.random.categorical(jax.random.fold_in(rng, i), scaled, axis=-1)
        return jnp.where(t > 0, drawn, jnp.argmax(logits, axis=-1))

    return _sampling_loop(logits_fn, first_logits, cache, choose, max_decode_length, eos_id)


# -------------------------------------------------------------------- beam search
def _map_batch_axis(fn: Callable[[jax.Array, int], jax.Array], cache: Cache,
                    batch_axes: Any) -> Cache:
    """Apply fn(leaf, axis) to the leaves that have a batch axis (axes leaf not None)."""
    return jax.tree_util.tree_map(lambda x, ax: x if ax is None else fn(x, ax), cache,
                                  batch_axes, is_leaf=lambda x: x is None)


def beam_search(logits_fn: LogitsFn, first_logits: jax.Array, cache: Cache, *,
                max_decode_length: int, cache_batch_axes: Any, beam_size: int = 4,
                alpha: float = 0.6, eos_id: Optional[int] = 1,
                finish_in_beam: Union[bool, jax.Array] = False) -> BeamOutput:
    """Beam search with the GNMT/T5 length penalty; returns the best beam and all beams.

    first_logits [batch, V] and `cache` are per example; the cache is tiled to
    [batch*beam, ...] along `cache_batch_axes` (a pytree like `cache` of int | None) and
    reordered by gathering the chosen parent beams every step, so `logits_fn` must accept
    batch*beam rows (example-major). Each step keeps the 2*beam best expansions: those
    ending in EOS join the finished pool (score = log p / penalty(length incl. EOS)), the
    best `beam` others stay live. At the last step every expansion is finished as is. The
    loop stops when no live beam can still beat the worst finished one.

    `finish_in_beam`: an expansion finishes (by EOS or at the last step) only when it ranks
    among the best `beam` of the step's 2*beam, as in fairseq's beam search (BART's own)
    and transformers' `generate`; the others that end in EOS are dropped. False: any of
    the 2*beam (T5X's). With alpha 0 (no length penalty) and `finish_in_beam`, the tokens
    are transformers' with `length_penalty=0.0` (tests/models/test_bart.py).
    """
    batch, vocab = first_logits.shape
    k, n = beam_size, max_decode_length
    cache = _map_batch_axis(lambda x, ax: jnp.repeat(x, k, axis=ax), cache, cache_batch_axes)
    first_logits = jnp.repeat(first_logits, k, axis=0)
    rows = jnp.arange(batch)[:, None]

    def gather(x, idx):   # x [batch, m, ...], idx [batch, j] -> [batch, j, ...]
        return x[rows, idx]

    def advance(state, logits):
        i, live_seqs, live_lp, fin_seqs, fin_scores, cache, _ = state
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, k, vocab)
        cand = (live_lp[..., None] + log_probs).reshape(batch, k * vocab)
        top_lp, top_idx = lax.top_k(cand, 2 * k)                       # [batch, 2k]
        parent, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        seqs = gather(live_seqs, parent)                                # [batch, 2k, n]
        seqs = jnp.where(jnp.arange(n) == i, token[..., None], seqs)
        stops = jnp.broadcast_to(i == n - 1, token.shape)               # [batch, 2k]
        if eos_id is not None:
            stops = stops | (token == eos_id)
        in_beam = jnp.arange(2 * k) < k                                 # top_k is sorted
        ends = stops & (top_lp > NEG_INF) & (in_beam | ~jnp.asarray(finish_in_beam, bool))
        # Finished pool: old finished + new ones, best k by penalized score.
        new_scores = jnp.where(ends, top_lp / length_penalty(i + 1, alpha), NEG_INF)
        pool_scores = jnp.concatenate([fin_scores, new_scores], axis=1)
        fin_scores, pick = lax.top_k(pool_scores, k)
        fin_seqs = gather(jnp.concatenate([fin_seqs, seqs], axis=1), pick)
        # Live beams: best k expansions that did not end.
        live_lp, pick = lax.top_k(jnp.where(stops, NEG_INF, top_lp), k)
        live_seqs = gather(seqs, pick)
        source = (rows * k + gather(parent, pick)).reshape(-1)         # [batch*k]
        cache = _map_batch_axis(lambda x, ax: jnp.take(x, source, axis=ax), cache,
                                cache_batch_axes)
        last = gather(token, pick).reshape(-1)
        return i + 1, live_seqs, live_lp, fin_seqs, fin_scores, cache, last

    live_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1))
    seqs = jnp.zeros((batch, k, n), jnp.int32)
    state = (jnp.int32(0), seqs, live_lp, seqs, jnp.full((batch, k), NEG_INF), cache,
             jnp.zeros((batch * k,), jnp.int32))
    state = advance(state, first_logits)

    def cond(state):
        i, _, live_lp, _, fin_scores, _, _ = state
        # Log-probs only fall and the penalty is largest at n: an upper bound per example.
        best_live = jnp.max(live_lp, axis=1) / length_penalty(n, alpha)
        return (i < n) & jnp.any(best_live > jnp.min(fin_scores, axis=1))

    def body(state):
        logits, cache = logits_fn(state[-1], state[-2], state[0])
        return advance(state[:-2] + (cache, state[-1]), logits)

    i, _, _, fin_seqs, fin_scores, _, _ = lax.while_loop(cond, body, state)
    return BeamOutput(fin_seqs[:, 0], fin_seqs, fin_scores, i)


# --------------------------------------------------------------------- model entry
def cache_batch_axes(make_cache: Callable[[int], Cache], batch: int) -> Any:
    """Which axis of each cache leaf is the batch (None if it has none), found by comparing
    the abstract caches for `batch` and `batch + 1` rows."""
    a = jax.eval_shape(lambda: make_cache(batch))
    b = jax.eval_shape(lambda: make_cache(batch + 1))

    def axis(x, y):
        diff = [d for d, (p, q) in enumerate(zip(x.shape, y.shape)) if p != q]
        return diff[0] if diff else None

    return jax.tree_util.tree_map(axis, a, b)


def _run_strategy(strategy: str, logits_fn_for: Callable[[int], LogitsFn],
                  first_logits: jax.Array, cache: Cache, axes_fn: Callable[[], Any],
                  rng: jax.Array, knobs: Mapping[str, jax.Array], max_decode_length: int,
                  beam_size: int):
    """knobs: traced eos_id and the strategy's options (no recompiles when they change)."""
    knobs = dict(knobs)
    eos_id = knobs.pop("eos_id")
    if strategy == "greedy":
        return greedy(logits_fn_for(1), first_logits, cache,
                      max_decode_length=max_decode_length, eos_id=eos_id)
    if strategy == "sample":
        return sample(logits_fn_for(1), first_logits, cache, rng,
                      max_decode_length=max_decode_length, eos_id=eos_id, **knobs)
    return beam_search(logits_fn_for(beam_size), first_logits, cache,
                       max_decode_length=max_decode_length, cache_batch_axes=axes_fn(),
                       beam_size=beam_size, eos_id=eos_id, **knobs)


def _encoder_decoder(model, params, batch, rng, knobs, strategy, max_decode_length, beam_size):
    module, variables = model.module, {"params": params}
    enc_tokens = batch["encoder_input_tokens"]                        # [b, in_len]
    enc_seg, enc_pos = batch.get("encoder_segment_ids"), batch.get("encoder_positions")
    b = enc_tokens.shape[0]
    encoded = module.apply(variables, enc_tokens, enc_seg, enc_pos,
                           method=EncoderDecoder.encode)               # [b, in_len, d]

    def make_cache(rows):   # zeros sized [rows, max_decode_length]; only shapes matter
        _, state = module.apply(variables, jnp.zeros((rows,) + encoded.shape[1:], encoded.dtype),
                                jnp.zeros((rows, max_decode_length), jnp.int32), decode=True,
                                mutable=["cache"], method=EncoderDecoder.decode)
        return state["cache"]

    def logits_fn_for(rep: int) -> LogitsFn:
        enc = jnp.repeat(encoded, rep, axis=0)
        seg = None if enc_seg is None else jnp.repeat(enc_seg, rep, axis=0)

        def logits_fn(tokens, cache, i):
            logits, state = module.apply({"params": params, "cache": cache}, enc,
                                         tokens[:, None], seg, decode=True, mutable=["cache"],
                                         method=EncoderDecoder.decode)
            return logits[:, -1].astype(jnp.float32), state["cache"]
        return logits_fn

    # Step 0 feeds the start token (config.decoder_start_id: T5 0, BART 2) at slot 0.
    start = jnp.full((b,), module.config.decoder_start_id, jnp.int32)
    first_logits, cache = logits_fn_for(1)(start, make_cache(b), 0)
    return _run_strategy(strategy, logits_fn_for, first_logits, cache,
                         lambda: cache_batch_axes(make_cache, 1), rng, knobs,
                         max_decode_length, beam_size)


def _left_pad(x: jax.Array, offset: jax.Array) -> jax.Array:
    """Shift row r of x [b, P] right by offset[r], filling with 0."""
    src = jnp.arange(x.shape[1])[None, :] - offset[:, None]
    return jnp.where(src >= 0, jnp.take_along_axis(x, jnp.maximum(src, 0), axis=1), 0)


def _decoder_only(model, params, batch, rng, knobs, strategy, max_decode_length, beam_size):
    module = model.module
    prompt = batch["decoder_input_tokens"]                            # [b, P]
    lengths = jnp.clip(batch["prompt_lengths"], 1, prompt.shape[1]).astype(jnp.int32)  # [b]
    b, width = prompt.shape
    offset = width - lengths                                          # left padding
    valid = (jnp.arange(width)[None, :] >= offset[:, None]).astype(jnp.int32)
    positions = jnp.maximum(jnp.arange(width)[None, :] - offset[:, None], 0)
    causal = batch.get("decoder_causal_attention")
    causal = None if causal is None else _left_pad(causal, offset)
    total = width + max_decode_length - 1                             # cache slots

    def make_cache(rows):
        return module.apply({"params": params}, jnp.zeros((rows, total), jnp.int32),
                            decode=True, mutable=["cache"])[1]["cache"]

    logits, state = module.apply({"params": params, "cache": make_cache(b)},
                                 _left_pad(prompt, offset), decoder_segment_ids=valid,
                                 decoder_positions=positions, decoder_causal_attention=causal,
                                 decode=True, mutable=["cache"])     # prefill
    first_logits = logits[:, -1].astype(jnp.float32)

    def logits_fn_for(rep: int) -> LogitsFn:
        start = jnp.repeat(lengths, rep)

        def logits_fn(tokens, cache, i):
            # The token chosen at step i-1 sits at position prompt_length + i - 1.
            pos = (start + i - 1)[:, None]
            logits, state = module.apply({"params": params, "cache": cache}, tokens[:, None],
                                         decoder_positions=pos, decode=True, mutable=["cache"])
            return logits[:, -1].astype(jnp.float32), state["cache"]
        return logits_fn

    return _run_strategy(strategy, logits_fn_for, first_logits, state["cache"],
                         lambda: cache_batch_axes(make_cache, 1), rng, knobs,
                         max_decode_length, beam_size)


def _encoder_inputs(batch: Mapping[str, Any], prompt_lengths) -> dict:
    """Encoder-decoder features for `_encoder_decoder` (no prompt: decoding starts at 0)."""
    keys = ("encoder_input_tokens", "encoder_segment_ids", "encoder_positions")
    return {k: jnp.asarray(batch[k]) for k in keys if k in batch}


class Decoding(NamedTuple):
    """How a family's `predict` decodes (`Family.decoding`)."""

    inputs: Callable[[Mapping[str, Any], Any], dict]   # (batch, prompt_lengths) -> features
    loop: Callable                                     # `_encoder_decoder` / `_decoder_only`
    # decoder-only: it continues a prompt in `decoder_input_tokens` (the evaluator writes
    # `[0, inputs...]` prompts; a tuned prompt fills the KV cache before it)
    continues_prompt: bool
    prompt_stack: Optional[Tuple[str, ...]] = None     # the stack prompt tuning prompts


@functools.partial(jax.jit, static_argnames=("model", "loop", "strategy", "max_decode_length",
                                             "beam_size"))
def _decode_jit(model, params, batch, rng, knobs, *, loop, strategy, max_decode_length,
                beam_size):
    return loop(model, params, batch, rng, knobs, strategy, max_decode_length, beam_size)


def decode(model, params, batch: Mapping[str, Any], *, max_decode_length: int,
           strategy: str = "greedy", eos_id: Optional[int] = 1,
           rng: Optional[jax.Array] = None, prompt_lengths: Optional[Any] = None,
           return_aux: bool = False, **options):
    """Decode a batch with the KV cache -> tokens [batch, max_decode_length] (pad after EOS).

    model: a model of a family that decodes (`Family.decoding`): an encoder-decoder
    (`ENCODER_DECODER`, T5's `EncoderDecoderModel`: uses `encoder_input_tokens` and, if
    present, `encoder_segment_ids` / `encoder_positions`; decoding starts from
    `config.decoder_start_id`: T5 0, BART 2) or
    a decoder-only model (`DECODER_ONLY`, GPT's `DecoderOnlyModel`), which continues a
    prompt: `decoder_input_tokens` [batch, width] (start token 0 first, as training
    inputs) whose first `prompt_lengths` [batch] tokens are the prompt; default lengths
    are `decoder_causal_attention.sum(-1)` (a prefix LM's prompt, attended bidirectionally
    exactly as in training), else
    `decoder_segment_ids > 0`, else the full width. Decoder-only models return only the
    generated continuation. Packed (several examples per row) batches are not supported.

    strategy: "greedy"; "sample" with options temperature (1.0), top_k (0: off), top_p
    (1.0: off), seeded by `rng` (default PRNGKey(0)); "beam" with options beam_size (4),
    alpha (0.6), finish_in_beam (False; True: fairseq's and transformers' rule, see
    `beam_search`). eos_id None never stops early. One compiled loop per model, strategy,
    length and beam size: eos_id and the other options are traced, so changing them does
    not recompile. return_aux=True returns (tokens, aux): aux["steps"] is the number of
    positions decoded before the loop stopped; beam search adds aux["beams"]
    [batch, beam, length] and aux["scores"] [batch, beam], best first.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown decoding strategy {strategy!r}; choose one of {STRATEGIES}")
    if max_decode_length < 1:
        raise ValueError(f"max_decode_length must be >= 1, got {max_decode_length}")
    defaults = {"greedy": {}, "sample": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
                "beam": {"beam_size": 4, "alpha": 0.6, "finish_in_beam": False}}[strategy]
    if set(options) - set(defaults):
        raise TypeError(f"strategy {strategy!r} takes options {sorted(defaults)}, "
                        f"got {sorted(options)}")
    knobs = {**defaults, **options}
    beam_size = int(knobs.pop("beam_size", 1))
    knobs = {k: jnp.asarray(v, {"top_k": jnp.int32, "finish_in_beam": bool}.get(k, jnp.float32))
             for k, v in knobs.items()}
    knobs["eos_id"] = jnp.int32(-1 if eos_id is None else eos_id)  # -1: never stops
    how = families.get(model.family).decoding
    if how is None:
        raise ValueError(f"the {model.family!r} family does not decode; "
                         f"{', '.join(families.names(lambda f: f.decoding))} do")
    rng = jax.random.PRNGKey(0) if rng is None else rng
    out = _decode_jit(model, params, how.inputs(batch, prompt_lengths), rng, knobs,
                      loop=how.loop, strategy=strategy,
                      max_decode_length=int(max_decode_length), beam_size=beam_size)
    if not return_aux:
        return out.tokens
    aux = {"steps": out.steps}
    if isinstance(out, BeamOutput):
        aux.update(beams=out.beams, scores=out.scores)
    return out.tokens, aux


def prompt_features(batch: Mapping[str, Any], prompt_lengths) -> dict:
    """Decoder-only features for `_decoder_only`: prompt tokens, lengths, prefix flags.

    With concrete lengths the prompt is trimmed to the longest one (less prefill work)."""
    tokens = jnp.asarray(batch["decoder_input_tokens"])
    causal = batch.get("decoder_causal_attention")
    if prompt_lengths is None:
        if causal is not None:
            prompt_lengths = jnp.sum(jnp.asarray(causal) > 0, axis=-1)
        elif "decoder_segment_ids" in batch:
            prompt_lengths = jnp.sum(jnp.asarray(batch["decoder_segment_ids"]) > 0, axis=-1)
        else:
            prompt_lengths = jnp.full(tokens.shape[:1], tokens.shape[1])
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    try:
        width = max(int(np.max(np.asarray(prompt_lengths))), 1)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        width = tokens.shape[1]                   # traced: keep the full width
    tokens = tokens[:, :width]
    causal = None if causal is None else causal[:, :width]
    out = {"decoder_input_tokens": tokens, "prompt_lengths": prompt_lengths}
    if causal is not None:
        out["decoder_causal_attention"] = jnp.asarray(causal, jnp.int32)
    return out


ENCODER_DECODER = Decoding(_encoder_inputs, _encoder_decoder, continues_prompt=False,
                           prompt_stack=("encoder",))
DECODER_ONLY = Decoding(prompt_features, _decoder_only, continues_prompt=True)
