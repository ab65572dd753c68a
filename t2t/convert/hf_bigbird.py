"""Hugging Face BigBird (model_type "big_bird": `BigBirdModel`, `BigBirdForMaskedLM`) <->
t2t `t2t.models.bert.BertModel` params.

BigBird is BERT's post-LN encoder (BERT's layer and MLM-head tables,
`t2t.convert.hf_bert`) with its own config keys and a pooler named `pooler` (no `.dense`).
Its attention is carried both ways: HF `attention_type` "original_full" <-> t2t
`attention_pattern="dense"`, "block_sparse" <-> "block_sparse", with `block_size` <->
`sparse_block_size` and `num_random_blocks`; `rescale_embeddings` <-> `scale_embeddings`.

The task-head classes `BigBirdForSequenceClassification` (dropout, dense, `hidden_act`,
dropout, out_proj: t2t's pooled head with the trunk's activation), `BigBirdForMultipleChoice`
(the backbone's pooler) and `BigBirdForTokenClassification` read and write t2t's
fine-tuning trees (`t2t.convert.hf_heads`). `BigBirdForQuestionAnswering`'s head (an
intermediate block with its own LayerNorm, question tokens masked out of the spans) is not
mapped: its backbone is read as a `BigBirdModel`.

Block-sparse outputs are not transformers' in eval mode: transformers then attends every
query block's "random" blocks to block 0; t2t keeps the paper's random plan
(`t2t.nn.block_sparse`, drawn from `random_blocks_seed`, which HF has no key for).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import numpy as np

from t2t.convert.hf_bert import (bert_config, bert_hf_config, bert_rules,
                                  encoder_hidden_states, mlm_logits, require_tied_decoder)
from t2t.convert.hf_common import HfFamily, require
from t2t.convert.hf_heads import TaskHeads, with_heads
from t2t.convert.rules import (Params, Rule, StateDict, copy,
                               export_params, import_params, linear, tree)
from t2t.nn.config import TransformerConfig

# HF attention_type <-> t2t attention_pattern
PATTERNS = {"original_full": "dense", "block_sparse": "block_sparse"}
ATTENTION_TYPES = {pattern: kind for kind, pattern in PATTERNS.items()}
# BigBirdConfig's defaults where they are not BertConfig's (google/bigbird-roberta-base's)
DEFAULTS = {"hidden_act": "gelu_new", "max_position_embeddings": 4096,
            "attention_type": "block_sparse", "block_size": 64, "num_random_blocks": 3,
            "rescale_embeddings": False, "use_bias": True}
CLASSES = ("BigBirdForMaskedLM", "BigBirdModel")


def bigbird_config(d: Mapping) -> TransformerConfig:
    """HF `BigBirdConfig` dict -> TransformerConfig (BERT's, with BigBird's attention)."""
    d = {**DEFAULTS, **d}
    if d["attention_type"] not in PATTERNS:
        raise ValueError(f"attention_type={d['attention_type']!r} is not one of "
                         f"{sorted(PATTERNS)}")
    if not d["use_bias"]:
        raise ValueError("use_bias=False (query/key/value without biases) has no t2t form: "
                         "t2t's use_bias covers every projection; use a use_bias=True model")
    if d.get("is_decoder") or d.get("add_cross_attention"):
        raise ValueError("BigBird as a decoder (is_decoder / add_cross_attention) is not "
                         "supported; t2t reads the encoder")
    return bert_config(d).replace(
        scale_embeddings=bool(d["rescale_embeddings"]),
        attention_pattern=PATTERNS[d["attention_type"]], sparse_block_size=d["block_size"],
        num_random_blocks=d["num_random_blocks"])


def bigbird_hf_config(c: TransformerConfig, architecture: str = CLASSES[0],
                      pad_token_id: int = 0) -> dict:
    """TransformerConfig -> HF `BigBirdConfig` dict (checks the config is a BigBird)."""
    require(c.attention_pattern in ATTENTION_TYPES, "BigBird",
            f"attention_pattern={c.attention_pattern!r} is not one of "
            f"{sorted(ATTENTION_TYPES)}")
    d = bert_hf_config(c.replace(scale_embeddings=False), architecture)
    del d["position_embedding_type"]
    return {**d, "model_type": "big_bird", "pad_token_id": pad_token_id,
            "rescale_embeddings": c.scale_embeddings, "use_bias": True,
            "attention_type": ATTENTION_TYPES[c.attention_pattern],
            "block_size": c.sparse_block_size, "num_random_blocks": c.num_random_blocks}


def bigbird_rules(c: TransformerConfig, root: str, pooler: bool, mlm: bool) -> List[Rule]:
    """BERT's table (no NSP head) with BigBird's pooler, `{root}pooler` a Linear."""
    rules = bert_rules(c, root, pooler=False, mlm=mlm, nsp=False)
    if pooler:
        d = c.d_model
        rules += [linear(f"{root}pooler.weight", "pooler/dense/kernel", (d, d)),
                  copy(f"{root}pooler.bias", "pooler/dense/bias", (d,))]
    return rules


def bigbird_params_from_hf(state: StateDict, config: TransformerConfig) -> Params:
    """HF BigBird state dict (numpy) -> BertModel params (pooler and MLM head as present)."""
    root = "bert." if any(k.startswith("bert.embeddings.") for k in state) else ""
    require_tied_decoder(state, root)
    rules = bigbird_rules(config, root, pooler=f"{root}pooler.weight" in state,
                          mlm="cls.predictions.transform.dense.weight" in state)
    return import_params(state, rules, config, None)


def bigbird_architecture(params: Params) -> str:
    """BigBirdForMaskedLM for a tree with an MLM head, else BigBirdModel."""
    return CLASSES[0] if "mlm_head" in tree(params) else "BigBirdModel"


def bigbird_params_to_hf(config: TransformerConfig, params: Params) -> Dict[str, np.ndarray]:
    """BertModel params (no NSP head) -> HF state dict (`bert.`-prefixed with the MLM head;
    the tied decoder weight left out, as HF's own files)."""
    p = tree(params)
    mlm = "mlm_head" in p
    return export_params(p, bigbird_rules(config, "bert." if mlm else "", "pooler" in p, mlm))


def _to_hf(model) -> Tuple[dict, Dict[str, np.ndarray]]:
    return (bigbird_hf_config(model.config, bigbird_architecture(model.params),
                              model.pad_token_id),
            bigbird_params_to_hf(model.config, model.params))


def _params_from_hf(state: StateDict, config: TransformerConfig, architecture: str) -> Params:
    return bigbird_params_from_hf(state, config)


def _split(config: TransformerConfig, p: Params, generator=None):
    """A t2t pretraining tree -> its HF model (an NSP head, if any, has no BigBird form)."""
    return {"model": (None, config, {k: v for k, v in p.items() if k != "nsp_head"})}


HEADS = TaskHeads("BigBird", lambda c: bigbird_rules(c, "bert.", pooler=False, mlm=False),
                  {"SequenceClassification": ("classifier.dense", "classifier.out_proj"),
                   "MultipleChoice": ("bert.pooler", "classifier")},
                  suffixes=("SequenceClassification", "MultipleChoice",
                            "TokenClassification"))
BIGBIRD = with_heads(
    HfFamily("big_bird", CLASSES, bigbird_config, _params_from_hf, _to_hf, mlm_logits,
             split=_split, hidden_states=encoder_hidden_states,
             read_as={"BigBirdForQuestionAnswering": "BigBirdModel"}),
    HEADS, lambda model: bigbird_hf_config(model.config, model.architecture,
                                           model.pad_token_id))
