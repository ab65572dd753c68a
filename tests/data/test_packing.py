"""First-fit packing: exact rows on hand examples; no example split or lost."""
import numpy as np
import pytest

from t2t.data.packing import FirstFitPacker, pack_examples, packing_efficiency


def ex(*lengths_and_starts):
    return {k: np.arange(s, s + n, dtype=np.int32) for k, (n, s) in zip(("inputs", "targets"),
                                                                       lengths_and_starts)}


def test_first_fit_hand_example():
    packer = FirstFitPacker({"inputs": 6, "targets": 4}, num_rows=2)
    assert packer.add(ex((4, 10), (2, 50)))  # row 0
    assert packer.add(ex((3, 20), (1, 60)))  # inputs do not fit row 0 -> row 1
    assert packer.add(ex((2, 30), (2, 70)))  # fits row 0 (inputs 6/6, targets 4/4)
    assert packer.add(ex((3, 40), (3, 80)))  # row 1
    assert not packer.add(ex((1, 90), (1, 99)))  # full: no row has room in both features
    rows = packer.rows()
    assert rows["inputs"].tolist() == [[10, 11, 12, 13, 30, 31], [20, 21, 22, 40, 41, 42]]
    assert rows["inputs_segment_ids"].tolist() == [[1, 1, 1, 1, 2, 2], [1, 1, 1, 2, 2, 2]]
    assert rows["inputs_positions"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert rows["targets"].tolist() == [[50, 51, 70, 71], [60, 80, 81, 82]]
    assert rows["targets_segment_ids"].tolist() == [[1, 1, 2, 2], [1, 2, 2, 2]]
    assert rows["targets_positions"].tolist() == [[0, 1, 0, 1], [0, 0, 1, 2]]
    assert packer.num_examples == 4
    assert packer.token_counts() == {"inputs": (12, 12), "targets": (8, 8)}


def test_unpacked_mode_and_scalars():
    packer = FirstFitPacker({"targets": 5}, 3, max_examples_per_row=1, scalar_keys=("label",))
    for i, n in enumerate([2, 1]):
        assert packer.add({"targets": np.full(n, 7 + i), "label": i + 4})
    rows = packer.rows(3)
    assert rows["targets"].tolist() == [[7, 7, 0, 0, 0], [8, 0, 0, 0, 0], [0] * 5]
    assert rows["targets_segment_ids"].tolist() == [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0] * 5]
    assert rows["label"].tolist() == [4, 5, 0]
    assert packing_efficiency(rows["targets_segment_ids"]) == pytest.approx(3 / 15)


def test_too_long_is_an_error():
    with pytest.raises(ValueError, match="trim before packing"):
        FirstFitPacker({"targets": 3}, 1).add({"targets": np.arange(4)})


def test_pack_examples_keeps_every_example_whole():
    rng = np.random.default_rng(0)
    examples = [{"targets": rng.integers(1, 100, size=rng.integers(1, 17)).astype(np.int32)}
                for _ in range(200)]
    rows = pack_examples(examples, {"targets": 16})
    found = []
    for tokens, seg, pos in zip(rows["targets"], rows["targets_segment_ids"],
                                rows["targets_positions"]):
        for s in range(1, seg.max() + 1):
            where = np.flatnonzero(seg == s)
            assert np.all(np.diff(where) == 1)  # contiguous
            assert pos[where].tolist() == list(range(len(where)))
            found.append(tokens[where].tolist())
    assert sorted(found) == sorted(e["targets"].tolist() for e in examples)
    assert len(rows["targets"]) < 200 * 0.7  # several examples per row
    assert packing_efficiency(rows["targets_segment_ids"]) > 0.9
