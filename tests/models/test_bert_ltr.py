"""BERT Table 5's 'LTR' row: BertPretrainingModel with a causal encoder trains unchanged on
the `bible_web_ltr` features (its preprocessor, EncoderConverter without NSP)."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.data import tasks as T
from t2t.data.converters import EncoderConverter
from t2t.data.pipeline import take
from t2t.data.sources import ListSource
from t2t.models.bert import BertPretrainingModel

from tests.nn.helpers import BERT_TINY

OPTS = {"xla_backend_optimization_level": 0}
PAIRS = 16  # a sentence is pairs "a f(a)": a random, f(a) given a


class PairVocab:
    """WordPiece-like ids: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, word w<i> -> 5 + i."""

    pad_id, unk_id, cls_id, sep_id, mask_id, vocab_size = 0, 1, 2, 3, 4, 64

    def encode(self, text, add_special_tokens=True):
        ids = [5 + int(w[1:]) for w in text.split()]
        return [self.cls_id, *ids, self.sep_id] if add_special_tokens else ids


def pair_books(n_books=40, verses=40, seed=0):
    """Books of verses made of (a, a + PAIRS) word pairs, a random: every second next token
    is given by the one before it, the others are unpredictable (enough text that 40
    batches never repeat, so nothing can be memorised)."""
    rng = np.random.default_rng(seed)
    books = []
    for b in range(n_books):
        text = [" ".join(f"w{a} w{a + PAIRS}" for a in rng.integers(0, PAIRS, 5))
                for _ in range(verses)]
        books.append({"id": f"B{b}", "verses": text})
    return books


CONFIG = BERT_TINY.replace(vocab_size=PairVocab.vocab_size, dropout_rate=0.0)


def ltr_batches(n, length=32, batch=8):
    task = T.Task("ltr_pairs", functools.partial(ListSource, pair_books()),
                  T.get_task("bible_web_ltr").preprocessors, PairVocab())
    converter = EncoderConverter({"inputs": length, "max_predictions": length}, pack=True,
                                 nsp=False)
    return take(task.get_pipeline(converter, batch, 0, process_index=0, process_count=1), n)


def train_losses(model, batches, steps, lr=3e-3):
    """Adam over `steps` batches in one compiled scan -> the per-step losses."""
    stacked = {k: jnp.stack([b[k] for b in batches]) for k in batches[0]}
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batches[0]))
    tx = optax.flatten(optax.adam(lr))

    def step(carry, batch):
        p, s = carry
        (loss, _), g = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch, None)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), loss

    run = lambda p: jax.lax.scan(step, (p, tx.init(p)), stacked, length=steps)[1]  # noqa
    return np.asarray(jax.jit(run, compiler_options=OPTS)(params))


def test_ltr_features_are_next_tokens():
    b = ltr_batches(1)[0]
    assert "next_sentence_labels" not in b
    rows = np.arange(8)[:, None]
    w = b["masked_weights"] > 0
    tokens = b["encoder_input_tokens"]
    np.testing.assert_array_equal(b["masked_ids"][w], tokens[rows, b["masked_positions"] + 1][w])
    assert w.sum() == ((tokens[:, :-1] > 0) & (tokens[:, 1:] > 0)
                       & (b["encoder_segment_ids"][:, :-1] == b["encoder_segment_ids"][:, 1:])
                       ).sum()


def test_causal_bert_cannot_look_ahead():
    """With encoder_causal the MLM logits at position i ignore tokens after i."""
    b = ltr_batches(1)[0]
    changed = dict(b, encoder_input_tokens=b["encoder_input_tokens"].copy())
    changed["encoder_input_tokens"][:, 20] = 7
    for causal in (True, False):
        model = BertPretrainingModel(CONFIG.replace(encoder_causal=causal))
        params = nn.unbox(model.init(jax.random.PRNGKey(0), b))
        run = jax.jit(lambda p, x: model.apply(p, x)["mlm_logits"])   # [b, max_pred, vocab]
        diff = np.abs(run(params, b) - run(params, changed)).max(-1)    # [b, max_pred]
        before = b["masked_positions"] < 20
        assert (diff[before].max() == 0) == causal, (causal, diff[before].max())
        assert diff[~before].max() > 0


def test_causal_bert_trains_on_ltr():
    """The loss falls from ~log(vocab) to the floor 0.5 log(PAIRS) (every second next
    token is a fresh random word) and not below it: nothing leaks from the future."""
    batches = ltr_batches(40)
    floor = 0.5 * np.log(PAIRS)
    losses = train_losses(BertPretrainingModel(CONFIG.replace(encoder_causal=True)), batches,
                          40, lr=1e-2)
    assert losses[0] > 3.5 and losses[-5:].mean() < 1.25 * floor, losses[::5]
    assert losses.min() > 0.9 * floor, (losses.min(), floor)
