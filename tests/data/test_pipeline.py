"""Pipeline: determinism, exact resume (mid-epoch, across epochs), shards, bad input, globals."""
import json

import numpy as np
import pytest

from t2t.data.converters import EncDecConverter, LMConverter
from t2t.data.pipeline import make_mixture_pipeline, make_pipeline, take
from t2t.data.preprocessors import SkipExample, span_corruption
from t2t.data.sources import InvalidRecord, ListSource
from t2t.train.partitioning import to_global_arrays

N = 37  # records; record r has tokens [1000 r + 1, ..., 1000 r + len] with len in 1..12


def lm_record(record, seed):
    """Record id -> one LM example; a random length makes packing do some work."""
    length = 1 + (record * 7) % 12
    return {"targets": 1000 * record + np.arange(1, length + 1)}


def records_in(batch, key="decoder_target_tokens"):
    """Record ids (the thousands) of every packed segment start in a batch."""
    tokens, positions = batch[key], batch["decoder_positions"]
    return (tokens[(positions == 0) & (tokens > 0)] // 1000).tolist()


def pipeline(seed=0, pack=True, **kwargs):
    """Two rows of 16: about 9 batches per epoch."""
    kwargs = {"num_epochs": 3, "process_index": 0, "process_count": 1, **kwargs}
    return make_pipeline(ListSource(range(N)), lm_record, LMConverter({"targets": 16}, pack=pack),
                         2, seed, **kwargs)


def same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b))


def test_deterministic_and_seed_dependent():
    a, b, c = take(pipeline(0), 10), take(pipeline(0), 10), take(pipeline(1), 10)
    assert same(a, b) and not same(a, c)
    assert a[0]["decoder_target_tokens"].shape == (2, 16)


def test_epochs_see_every_record_once_in_new_order():
    batches = list(pipeline(0, pack=False))  # one example per row: rows keep the stream order
    seen = [r for b in batches for r in records_in(b)]
    assert len(seen) == 3 * N
    epochs = [seen[i * N:(i + 1) * N] for i in range(3)]
    assert all(sorted(e) == list(range(N)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    unshuffled = [r for b in pipeline(0, False, shuffle=False, num_epochs=1) for r in records_in(b)]
    assert unshuffled == list(range(N))
    packed = [r for b in pipeline(0) for r in records_in(b)]
    assert sorted(packed) == sorted(seen)


@pytest.mark.parametrize("k", [1, 4, 9, 17])  # 17 batches crosses the first epoch boundary
def test_exact_resume(k):
    full = list(pipeline(0))
    assert len(full) > 20
    it = pipeline(0)
    take(it, k)
    state = json.loads(json.dumps(it.get_state()))  # JSON round trip
    resumed = pipeline(0)
    resumed.set_state(state)
    rest = list(resumed)
    assert same(rest, full[k:])
    fresh = pipeline(0)
    list(fresh)
    assert resumed.stats == fresh.stats  # counters resume too
    epoch = [r for b in full[:k] for r in records_in(b)]
    assert len(epoch) == state["stats"]["examples"]


def test_resume_replays_one_element_not_the_stream():
    calls = []

    def counting(record, seed):
        calls.append(record)
        return lm_record(record, seed)

    it = make_pipeline(ListSource(range(N)), counting, LMConverter({"targets": 16}), 4, 0,
                       num_epochs=1, process_index=0, process_count=1, read_threads=1, prefetch=1)
    done = {r for b in take(it, 2) for r in records_in(b)}
    state = it.get_state()
    resumed = make_pipeline(ListSource(range(N)), counting, LMConverter({"targets": 16}), 4, 0,
                            num_epochs=1, process_index=0, process_count=1, read_threads=1,
                            prefetch=1)
    calls.clear()
    resumed.set_state(state)
    next(resumed)
    assert len(done) >= 8 and not done & set(calls)  # nothing already batched is re-read


def test_shards_disjoint_and_complete():
    seen = []
    for index in range(3):
        it = make_pipeline(ListSource(range(N)), lm_record, LMConverter({"targets": 16}), 6, 0,
                           num_epochs=1, process_index=index, process_count=3)
        batches = list(it)
        assert all(b["decoder_target_tokens"].shape == (2, 16) for b in batches)  # 6 // 3 rows
        seen.extend(r for b in batches for r in records_in(b))
    assert sorted(seen) == list(range(N))


def test_resume_with_another_process_count_is_refused():
    it = make_pipeline(ListSource(range(N)), lm_record, LMConverter({"targets": 16}), 4, 0,
                       process_index=0, process_count=2)
    take(it, 2)
    other = make_pipeline(ListSource(range(N)), lm_record, LMConverter({"targets": 16}), 4, 0,
                          process_index=0, process_count=1)
    with pytest.raises(ValueError, match="process_count"):
        other.set_state(it.get_state())


def test_dynamic_objective_per_epoch():
    def corrupt(record, seed):
        return span_corruption(np.arange(10, 60), seed=seed, sentinel_id=999)

    converter = EncDecConverter({"inputs": 64, "targets": 32}, pack=False)
    it = make_pipeline(ListSource([0]), corrupt, converter, 1, 0, num_epochs=2, process_index=0,
                       process_count=1)
    first, second = list(it)
    assert not np.array_equal(first["encoder_input_tokens"], second["encoder_input_tokens"])


def test_bad_input_is_counted_not_fatal():
    records = ["ok", "", InvalidRecord("undecodable", b"\xff"), "boom", "long", "skip", "ok"]

    def preprocess(record, seed):
        if record == "boom":
            raise RuntimeError("a bug in a preprocessor")
        if record == "skip":
            raise SkipExample("too_short")
        if not record:
            return None
        if record == "long":
            return {"targets": np.arange(1, 30)}
        return [{"targets": [5, 6]}, {"targets": []}]  # the second is empty

    it = make_pipeline(ListSource(records), preprocess, LMConverter({"targets": 8}), 2, 0,
                       shuffle=False, num_epochs=1, process_index=0, process_count=1)
    batches = list(it)
    stats = it.stats
    assert stats["documents"] == 7 and stats["examples"] == 3
    assert stats["skipped"] == {"undecodable": 1, "error": 1, "too_short": 1, "empty": 2}
    assert stats["truncated"] == 1 and stats["truncated_tokens"] == 29 - 8
    assert stats["batches"] == len(batches) == 1
    assert stats["packing_efficiency"]["targets"] == pytest.approx(12 / 16)
    strict = make_pipeline(ListSource(["boom"]), preprocess, LMConverter({"targets": 8}), 2, 0,
                           num_epochs=1, process_index=0, process_count=1, strict=True)
    with pytest.raises(RuntimeError, match="a bug"):
        next(strict)


def test_mixture_rates_and_resume():
    sources = [ListSource(range(0, 10)), ListSource(range(50, 60))]
    components = [(sources[0], lm_record, 3.0), (sources[1], lm_record, 1.0)]

    def make():
        return make_mixture_pipeline(components, LMConverter({"targets": 16}), 4, 0,
                                     process_index=0, process_count=1)

    batches = take(make(), 30)
    seen = np.array([r for b in batches for r in records_in(b)])
    assert abs((seen < 50).mean() - 0.75) < 0.03
    it = make()
    take(it, 7)
    resumed = make()
    resumed.set_state(json.loads(json.dumps(it.get_state())))
    assert same(take(resumed, 5), batches[7:12])


def test_to_global_arrays():
    import jax
    from jax.sharding import Mesh, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "tensor"))
    batch = next(iter(make_pipeline(ListSource(range(N)), lm_record, LMConverter({"targets": 16}),
                                    8, 0, process_index=0, process_count=1)))
    batch["labels"] = np.arange(8, dtype=np.int32)  # a [batch] feature
    arrays = to_global_arrays(batch, mesh)
    tokens = arrays["decoder_target_tokens"]
    assert tokens.shape == (8, 16) and tokens.sharding.spec == PartitionSpec(("data",))
    assert len(tokens.addressable_shards) == 8
    assert tokens.addressable_shards[0].data.shape == (2, 16)
    np.testing.assert_array_equal(np.asarray(tokens), batch["decoder_target_tokens"])
    assert arrays["labels"].shape == (8,)
    explicit = to_global_arrays(batch, mesh, PartitionSpec("data", "tensor"))
    assert explicit["decoder_target_tokens"].addressable_shards[0].data.shape == (2, 8)


def test_worker_processes_give_the_same_batches_and_resume():
    # the worker packs whole batches (PackedBatches): one worker gives 0 workers' batches
    in_process = pipeline(0, num_epochs=1)
    reference = list(in_process)
    it = pipeline(0, num_epochs=1, worker_count=1)
    head = take(it, 3)
    state = json.loads(json.dumps(it.get_state()))
    assert same(head + list(it), reference)
    assert it.stats == in_process.stats
    resumed = pipeline(0, num_epochs=1, worker_count=1)
    resumed.set_state(state)
    assert same(list(resumed), reference[3:])
    with pytest.raises(ValueError, match="worker_count"):
        pipeline(0, num_epochs=1).set_state(state)


def test_a_task_whose_every_record_is_skipped_fails_instead_of_spinning(monkeypatch):
    from t2t.data import pipeline
    monkeypatch.setattr(pipeline, "MAX_BARREN_RECORDS", 50)

    def never(record, seed):
        raise SkipExample("too_long")

    it = make_pipeline(ListSource(range(7)), never, LMConverter({"targets": 16}), 4, 0)
    with pytest.raises(ValueError, match=r"50 records in a row gave no example.*too_long"):
        next(it)


def test_a_state_saved_when_the_main_process_packed_still_resumes():
    """Version 1 (packing in the main process) has the same position one level up."""
    full = list(pipeline(0))
    it = pipeline(0)
    take(it, 5)
    state = it.get_state()
    old = {**state, "version": 1, **state["parent"]}   # parent, position, counted at the top
    resumed = pipeline(0)
    resumed.set_state(json.loads(json.dumps(old)))
    assert same(list(resumed), full[5:])
    with pytest.raises(ValueError, match="state version 1"):
        pipeline(0, worker_count=1).set_state({**old, "config": {}})
