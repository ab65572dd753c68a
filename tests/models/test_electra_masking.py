"""ELECTRA's generator masking and replacement sampling against the authors' code
(google-research/electra `pretrain_helpers.mask`, `run_pretraining._get_fake_data`):
15% of the row's tokens chosen uniformly among non-special ones, 85% of them [MASK] and
15% kept (no random tokens); replacements sampled from the generator's softmax, and a
position labelled "replaced" exactly where its sample differs from the original."""
import flax.linen as nn
import jax
import numpy as np

from t2t.data.electra_masking import electra_mask
from t2t.models.electra import ElectraPretraining, ElectraPretrainingModel
from tests.models.test_electra import CFG

CLS, SEP, MASK = 2, 3, 4
DRAWS = 3000


def _row(length=128):
    rng = np.random.RandomState(0)
    row = rng.randint(5, 500, length).astype(np.int32)
    row[0], row[60], row[-1] = CLS, SEP, SEP
    return row


def test_masking_rates_over_many_draws():
    row = _row()
    candidates = np.flatnonzero(~np.isin(row, [CLS, SEP]))
    chosen = np.zeros(len(row))
    kept = total = 0
    for seed in range(DRAWS):
        out = electra_mask(row, seed, MASK, (CLS, SEP, 0, MASK), max_predictions=20)
        w = out["masked_weights"]
        k = int(w.sum())
        assert k == round(0.15 * len(row)) == 19                         # of all 128 tokens
        positions = out["masked_positions"][:k]
        assert np.all(np.diff(positions) > 0) and np.isin(positions, candidates).all()
        np.testing.assert_array_equal(out["masked_ids"][:k], row[positions])
        changed = np.flatnonzero(out["inputs"] != row)
        assert set(changed) <= set(positions)                  # nothing outside the choice
        assert np.all(out["inputs"][changed] == MASK)          # and no random tokens
        chosen[positions] += 1
        kept += k - len(changed)
        total += k
    # 15% of the chosen keep their token: n = 57,000, sd 0.0015; 5 sd.
    assert abs(kept / total - 0.15) < 5 * np.sqrt(0.15 * 0.85 / total), kept / total
    # Uniform over the 125 candidates: chi-square (124 dof, mean 124, sd 15.7) below 6 sd.
    expected = DRAWS * 19 / len(candidates)
    chi2 = ((chosen[candidates] - expected) ** 2 / expected).sum()
    assert chi2 < 124 + 6 * 15.7, chi2
    assert chosen[[0, 60, 127]].sum() == 0


def test_short_and_long_rows():
    short = electra_mask([CLS, 9, SEP], 0, MASK, (CLS, SEP))
    assert short["masked_weights"].sum() == 1 and short["masked_positions"][0] == 1
    long = electra_mask(_row(512), 0, MASK, (CLS, SEP), max_predictions=20)
    assert long["masked_weights"].sum() == 20                  # round(76.8) clipped to 20
    only_special = electra_mask([CLS, SEP], 0, MASK, (CLS, SEP))
    assert only_special["masked_weights"].sum() == 0


def _peaked_batch():
    """Five masked positions, three of whose originals are token 7."""
    tokens = np.array([[CLS, 7, 11, 7, 12, 13, 7, 14, 15, 16, 17, SEP]], np.int32)
    positions = np.array([[1, 2, 3, 4, 6]], np.int32)
    masked = tokens.copy()
    masked[0, positions[0]] = MASK
    return {"encoder_input_tokens": masked, "encoder_segment_ids": np.ones_like(tokens),
            "token_type_ids": np.zeros_like(tokens), "masked_positions": positions,
            "masked_ids": np.take_along_axis(tokens, positions, 1),
            "masked_weights": np.ones((1, 5), np.float32)}


def test_replacements_are_softmax_samples_and_labels_mark_differences():
    """E[replaced fraction] = Σ_i (1 − p_gen(original_i)) / #tokens: the generator's own
    softmax, sampled (argmax would give 2/12, uniform samples ≈ 4.9/12)."""
    model = ElectraPretrainingModel(CFG, generator_size=0.25)
    batch = _peaked_batch()
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    bias = params["generator_head"]["bias"]
    params["generator_head"]["bias"] = bias.at[7].add(5.0 - bias[7])   # p(7) ≈ 0.5
    logits = model.module.apply({"params": params}, batch["encoder_input_tokens"],
                                batch["masked_positions"], batch["encoder_segment_ids"],
                                method=ElectraPretraining.generate)             # [1, 5, V]
    p_original = np.take_along_axis(np.asarray(jax.nn.softmax(logits))[0],
                                    batch["masked_ids"][0][:, None], 1)[:, 0]
    assert 0.3 < p_original[[0, 2, 4]].min() and p_original[[0, 2, 4]].max() < 0.8
    want = (1 - p_original).sum() / 12
    keys = jax.random.split(jax.random.PRNGKey(1), DRAWS)
    fractions = jax.jit(jax.vmap(lambda k: model.loss_fn(params, batch, k)[1][
        "replaced_fraction"]))(keys)
    sd = np.sqrt((p_original * (1 - p_original)).sum()) / 12 / np.sqrt(DRAWS)
    assert abs(float(fractions.mean()) - want) < 5 * sd, (float(fractions.mean()), want, sd)
    for wrong in (2 / 12, (5 - 5 / CFG.vocab_size) / 12):        # argmax, uniform samples
        assert abs(want - wrong) > 20 * sd


def test_the_electra_task_masks_as_the_authors_code():
    """`electra_tiny_bible.gin` trains on bible_web_electra: its rows carry ELECTRA's
    masking (checked here on the held-out twin's rows, every one of them)."""
    import t2t.data.catalog.bible_successors  # noqa: F401  registers the tasks
    from t2t.data import tasks as tasks_lib
    from t2t.run.experiment import task_name
    assert task_name(None, "bible_web", "electra_rtd") == "bible_web_electra"
    task = tasks_lib.get_task("bible_web_electra_validation")
    v = task.vocabulary
    kept = total = 0
    for i in range(len(task.source)):
        for ex in task.preprocess(task.source[i], (0, i), {"inputs": 128,
                                                           "max_predictions": 20}):
            k = int(ex["masked_weights"].sum())
            assert k == min(20, max(1, round(0.15 * len(ex["inputs"]))))
            positions, ids = ex["masked_positions"][:k], ex["masked_ids"][:k]
            assert not np.isin(ids, [v.cls_id, v.sep_id, v.pad_id]).any()
            assert np.all((ex["inputs"][positions] == v.mask_id) |
                          (ex["inputs"][positions] == ids))             # no random tokens
            kept += int((ex["inputs"][positions] == ids).sum())
            total += k
    assert total > 3000
    assert abs(kept / total - 0.15) < 5 * np.sqrt(0.15 * 0.85 / total), (kept, total)
