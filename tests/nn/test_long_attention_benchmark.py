"""benchmarks/long_attention.py (issue 59's length benchmark) at tiny sizes: its table and
JSON, XLA's memory growing linearly with length for the sparse patterns and quadratically
for dense, the plot, a program over the memory limit reported but not run, and a cell in
its own worker process."""
import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import long_attention  # noqa: E402  (benchmarks/long_attention.py)

# 2 heads of 8; window 32 (chunks of 16) + 1 global; blocks of 16, 1 random: at 256 and
# 512 tokens (16 and 32 blocks, over the 7 block_sparse needs) every pattern is sparse
TINY = ["--heads", "2", "--head-dim", "8", "--window", "32", "--block", "16",
        "--random-blocks", "1", "--no-write"]


def _rows(text):
    """The table's data rows as lists of cells."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_tiny_run_table_json_plot_and_memory_growth(tmp_path, capsys):
    out, png = tmp_path / "long.json", tmp_path / "long.png"
    result = long_attention.main(["--lengths", "256", "512", "--runs", "2", "--warmup", "0",
                                  "--in-process", "--out", str(out), "--plot", str(png),
                                  *TINY])
    text = capsys.readouterr().out
    assert "Machine: " in text and "logical CPUs" in text            # the host, as others
    rows = _rows(text)
    assert [(r[0], r[1]) for r in rows] == [(n, p) for n in ("256", "512")
                                            for p in long_attention.PATTERNS]
    for row in rows:
        assert len(row) == 8 and row[7] == "", row                   # all run, none dense
        assert all(float(v) > 0 for v in row[2:6]), row

    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["shape"] == {"heads": 2, "head_dim": 8, "window": 32, "global_tokens": 1,
                              "block": 16, "random_blocks": 1}
    assert saved["host"]["cpu_flags"] and saved["isolated"] is False
    cells = {(c["length"], c["pattern"]): c for c in saved["cells"]}
    assert len(cells) == 6
    for cell in cells.values():
        assert not cell["dense_fallback"] and cell["skipped"] is None
        for name in long_attention.PROGRAMS:
            program = cell[name]
            assert len(program["runs_ms"]) == 2 and program["ms"] > 0
            assert program["skipped"] is None and program["temp_bytes"] > 0
        # forward + backward keeps more than the forward; its output is the gradients
        assert cell["forward_backward"]["temp_bytes"] > cell["forward"]["temp_bytes"]
        assert cell["forward_backward"]["output_bytes"] > cell["forward"]["output_bytes"]
    for name in long_attention.PROGRAMS:
        def growth(pattern):
            return cells[512, pattern][name]["temp_bytes"] / cells[256, pattern][name][
                "temp_bytes"]
        # l x l scores: x4 for twice the tokens; O(l * w) and O(l * blocks * b): x2
        assert 3.4 < growth("dense") < 4.6, (name, growth("dense"))
        for pattern in ("sliding_window", "block_sparse"):
            assert 1.6 < growth(pattern) < 2.5, (name, pattern, growth(pattern))
            assert (cells[512, pattern][name]["temp_bytes"]
                    < cells[512, "dense"][name]["temp_bytes"] / 2)

    header = png.read_bytes()[:24]                      # PNG signature, then IHDR's size
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width > 2 * height > 0                       # two panels side by side


def test_a_program_over_the_memory_limit_is_compiled_not_run(capsys):
    """Its XLA memory is reported, its time is not, and the row says why; block_sparse on
    too few blocks (256 tokens of 64) says that it attends densely."""
    result = long_attention.main(["--lengths", "256", "--patterns", "block_sparse",
                                  "--in-process", "--memory-limit-gib", "1e-6",
                                  "--heads", "2", "--head-dim", "8", "--no-write"])
    (cell,) = result["cells"]
    assert cell["dense_fallback"]
    for name in long_attention.PROGRAMS:
        assert cell[name]["ms"] is None and cell[name]["runs_ms"] == []
        assert cell[name]["temp_bytes"] > 0
        assert "over the 0.00 GiB limit" in cell[name]["skipped"]
    (row,) = _rows(capsys.readouterr().out)
    assert row[2] == row[3] == row[6] == "—" and float(row[4]) > 0
    assert row[7].startswith("too few blocks: block_sparse attends densely; fwd not run: ")
    assert "; fwd+bwd not run: XLA needs " in row[7]


def test_a_cell_runs_in_its_own_process_and_a_stopped_one_says_why(capsys):
    """The default: each cell in a worker process, whose peak RSS growth is its own; a
    worker over --timeout leaves a row saying so."""
    result = long_attention.main(["--lengths", "128", "--patterns", "dense", "--runs", "1",
                                  "--warmup", "0", *TINY])
    (cell,) = result["cells"]
    assert result["isolated"] and cell["skipped"] is None
    for name in long_attention.PROGRAMS:
        assert cell[name]["ms"] > 0 and cell[name]["temp_bytes"] > 0
        assert cell[name]["peak_rss_bytes"] is not None
    stopped = long_attention.main(["--lengths", "128", "--patterns", "dense",
                                   "--timeout", "0.01", *TINY])
    (cell,) = stopped["cells"]
    assert cell["skipped"] == "worker stopped: over the 0.01 s limit"
    assert all(cell[name]["temp_bytes"] is None for name in long_attention.PROGRAMS)
    row = _rows(capsys.readouterr().out)[-1]
    assert row[7] == "worker stopped: over the 0.01 s limit"
