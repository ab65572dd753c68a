"""dtype="auto": the choice for each kind of host, its log line, and config.gin."""
import logging
import types

import gin
import jax
import pytest

from t2t.run import gin_utils
from t2t.errors import ConfigError
from t2t.nn.config import TransformerConfig
from t2t.run import configurables as configured
from t2t import precision
from t2t.run import experiment

# /proc/cpuinfo excerpts (flags cut down to the ones that matter plus neighbours).
AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand avx2 bmi2 sha_ni
"""
ZEN4 = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni
"""
AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8581C
flags\t\t: fpu sse2 avx2 avx512f amx_tile amx_int8 amx_bf16
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm
"""


def cpu(text, machine="x86_64", probe=None):
    return precision.choose("cpu", cpu_flags=precision.cpu_flags(text), machine=machine,
                            probe=probe)


def never_probe():
    raise AssertionError("the flags decide on x86: no probe")


def test_avx2_only_cpu_keeps_float32():
    choice = cpu(AVX2_ONLY, probe=never_probe)
    assert choice.dtype == "float32"
    assert choice.describe() == "float32 (this CPU has avx2 but no avx512_bf16/amx_bf16)"


def test_avx512_bf16_cpu_takes_bfloat16():
    choice = cpu(ZEN4, probe=never_probe)
    assert choice == precision.Choice("bfloat16", "avx512_bf16 on this CPU")
    assert choice.describe() == "bfloat16 matmuls (avx512_bf16 on this CPU)"


def test_amx_cpu_takes_bfloat16():
    assert cpu(AMX, probe=never_probe) == precision.Choice("bfloat16", "amx_bf16 on this CPU")


def test_accelerators():
    assert precision.choose("tpu").dtype == "bfloat16"
    assert precision.choose("gpu", gpu_capability="9.0") == precision.Choice(
        "bfloat16", "GPU compute capability 9.0")
    assert precision.choose("gpu", gpu_capability="8.0").dtype == "bfloat16"     # A100
    assert precision.choose("gpu", gpu_capability="7.0").dtype == "float32"      # V100
    assert precision.choose("gpu", gpu_capability="gfx90a").dtype == "bfloat16"  # ROCm MI200
    assert precision.choose("METAL").dtype == "float32"


def test_mute_flags_ask_the_probe():
    """Arm's 'bf16' flag or no /proc/cpuinfo at all: a measured speed-up decides."""
    assert cpu(GRAVITON, machine="aarch64", probe=lambda: 1.9).dtype == "bfloat16"
    slow = cpu(GRAVITON, machine="aarch64", probe=lambda: 0.6)
    assert slow == precision.Choice("float32", "bf16 matmul 0.60x float32 in a start-up probe")
    assert cpu(None, machine="arm64", probe=lambda: 1.1).dtype == "float32"
    assert cpu(None, machine="arm64").dtype == "float32"


def test_cpu_flags_and_model_parse_cpuinfo():
    assert {"avx512_bf16", "avx2"} <= precision.cpu_flags(ZEN4)
    assert "avx512_bf16" not in precision.cpu_flags(AVX2_ONLY)
    assert precision.cpu_flags(None) is None and precision.cpu_flags("processor: 0\n") is None
    assert precision.cpu_model(ZEN4) == "AMD EPYC 9B14"


def test_probe_measures_a_ratio():
    speedup = precision.probe_bf16_speedup(size=128, repeats=2)
    assert 0.01 < speedup < 100


@pytest.fixture
def host(monkeypatch):
    """This process's choice made afresh from a fake /proc/cpuinfo, and cleared after."""
    def fake(text):
        monkeypatch.setattr(precision, "read_cpuinfo", lambda: text)
        monkeypatch.setattr(precision.platform_lib, "machine", lambda: "x86_64")
        precision.auto_choice.cache_clear()
    yield fake
    precision.auto_choice.cache_clear()


def test_auto_resolves_once_and_logs_one_line(host, caplog):
    assert jax.devices()[0].platform == "cpu"
    host(ZEN4)
    with caplog.at_level(logging.INFO, logger="t2t"):
        configs = [TransformerConfig(dtype="auto"), TransformerConfig(dtype="auto", d_model=64)]
    assert [c.dtype for c in configs] == ["bfloat16", "bfloat16"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("t2t")] == [
        "precision: bfloat16 matmuls (avx512_bf16 on this CPU)"]
    host(AVX2_ONLY)
    assert TransformerConfig(dtype="auto").dtype == "float32"
    assert TransformerConfig(dtype="bfloat16").dtype == "bfloat16"


def test_unknown_dtype_is_one_line():
    """A ConfigError: the command line prints it as one line and exits 2."""
    with pytest.raises(ConfigError, match=r"^TransformerConfig.dtype='fp16'; choose one of "
                                         r"\['float32', 'bfloat16', 'auto'\]"):
        TransformerConfig(dtype="fp16")


@pytest.mark.parametrize("text,dtype", [(ZEN4, "bfloat16"), (AVX2_ONLY, "float32")])
def test_operative_config_says_what_auto_became(host, text, dtype):
    """hardware/cpu.gin asks for 'auto'; config.gin keeps 'auto' and adds what it meant."""
    host(text)
    gin_utils.parse(["hardware/cpu.gin"], [])
    cfg = configured.TransformerConfig()
    assert cfg.dtype == dtype
    exp = types.SimpleNamespace(trainer=types.SimpleNamespace(
        model=types.SimpleNamespace(config=cfg, family="t5")))
    text = experiment.operative_config(exp)
    assert "TransformerConfig.dtype = 'auto'" in text
    assert f"# TransformerConfig.dtype 'auto' resolved to '{dtype}' on this host: " in text
    gin.clear_config()
    gin_utils.parse([], ["TransformerConfig.dtype = 'float32'"])
    exp.trainer.model.config = configured.TransformerConfig()
    assert "resolved to" not in experiment.operative_config(exp)


def test_environment_pins_what_auto_means(host, monkeypatch, caplog):
    """T2T_AUTO_DTYPE overrides the host's choice (a grid keeps its precision on another kind
    of host); the config still says 'auto', and its note says why."""
    host(ZEN4)
    monkeypatch.setenv("T2T_AUTO_DTYPE", "float32")
    with caplog.at_level(logging.INFO, logger="t2t"):
        assert TransformerConfig(dtype="auto").dtype == "float32"
    assert "precision: float32 (T2T_AUTO_DTYPE=float32 in the environment)" in [
        r.getMessage() for r in caplog.records]
    host(AVX2_ONLY)
    monkeypatch.setenv("T2T_AUTO_DTYPE", "bfloat16")
    assert TransformerConfig(dtype="auto").dtype == "bfloat16"
    assert TransformerConfig(dtype="float32").dtype == "float32"
    host(ZEN4)
    monkeypatch.setenv("T2T_AUTO_DTYPE", "")
    assert TransformerConfig(dtype="auto").dtype == "bfloat16"
    host(ZEN4)
    monkeypatch.setenv("T2T_AUTO_DTYPE", "fp16")
    with pytest.raises(ConfigError, match=r"^T2T_AUTO_DTYPE='fp16'; set it to float32 or "
                                         r"bfloat16"):
        TransformerConfig(dtype="auto")
