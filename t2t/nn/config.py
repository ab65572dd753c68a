"""One frozen config that describes every Transformer stack in t2t."""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax.numpy as jnp

from t2t.errors import ConfigError

NORM_TYPES = ("layer", "rms", "none")
POSITION_TYPES = ("learned", "sinusoidal", "relative", "rotary", "none")
ATTENTION_SCALES = ("sqrt", "folded")
ATTENTION_PATTERNS = ("dense", "sliding_window", "block_sparse")  # encoder self-attention
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims", "save_qkv_proj",
                  "save_qkv_out_proj")
KERNEL_INITS = ("variance_scaling", "normal")
DTYPES = ("float32", "bfloat16", "auto")
SHARE_LAYERS_IN = ("both", "encoder", "decoder")
OUTPUT_LAYERS = ("softmax", "adaptive_softmax", "mixture_of_softmaxes")
CONVOLUTIONS = ("none", "lightweight", "dynamic")
RESIDUAL_SCALINGS = ("none", "rezero", "fixup")
LAYER_TYPES = ("transformer", "weighted", "evolved")
ATTENTION_KERNELS = ("auto", "xla", "cudnn", "splash")   # t2t/nn/attention_kernels.py
SYNTHESIZERS = ("none", "dense", "dense_plus", "dense_plus_alpha", "factorized", "random",
                "random_plus", "random_plus_alpha")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Architecture and numerics of a Transformer.

    One config drives the encoder (BERT), decoder (GPT) and encoder-decoder (T5) stacks.
    Defaults are T5.1.1-small-like; presets live in `configs/models/*.gin`.
    """

    vocab_size: int = 32128
    d_model: int = 512
    num_heads: int = 6
    head_dim: int = 64
    d_ff: int = 1024
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8

    # Feed-forward: one activation = plain MLP; several = gated (their product), as in
    # t5x: ("gelu_tanh", "linear") is GeGLU (T5.1.1), ("silu", "linear") is SwiGLU.
    mlp_activations: Sequence[str] = ("gelu_tanh", "linear")

    norm_type: str = "rms"            # "layer" (BERT, GPT-2), "rms" (T5) or "none" (ReZero, Fixup)
    norm_eps: float = 1e-6            # BERT 1e-12, GPT-2 1e-5, T5 1e-6
    pre_norm: bool = True             # pre-LN (T5, GPT-2) vs post-LN (BERT)
    use_bias: bool = False            # biases on dense layers (BERT, GPT-2)

    position_embedding: str = "relative"  # learned | sinusoidal | relative | rotary | none
    max_length: int = 512             # rows of the learned/sinusoidal position table
    position_offset: int = 0          # Encoder and Decoder positions start here (RoBERTa,
    #   BART: 2)
    relative_buckets: int = 32
    relative_max_distance: int = 128
    rotary_base: float = 10000.0

    type_vocab_size: int = 0          # BERT sentence A/B embeddings (2); 0 = none
    embedding_dim: Optional[int] = None  # ALBERT factorized embedding size E (< d_model)
    project_summed_embeddings: bool = False  # ALBERT/ELECTRA: token + position + type tables
    #   all of width E, summed and normed there, then projected to d_model by the stack's
    #   `embedding_projection`; False projects the token embeddings alone, before the sum
    embedding_norm: bool = False      # LayerNorm right after the embeddings (BERT)
    scale_embeddings: bool = False    # multiply token embeddings by sqrt(d_model) (Vaswani)

    tie_embeddings: bool = True       # output layer = token embedding transposed
    scale_tied_logits: bool = False   # T5.1.0: tied logits scaled by d_model ** -0.5
    final_logits_bias: bool = False   # BART: a [vocab] bias `final_logits_bias` added to the
    #   logits; HF keeps it as a zero buffer it never trains, t2t's is a param it trains
    decoder_start_id: int = 0         # first decoder input (HF decoder_start_token_id: T5 0,
    #   BART 2 = </s>); decoding and the shift-right training features start with it
    share_layers: bool = False        # ALBERT cross-layer parameter sharing
    share_encoder_decoder: bool = False  # T5 paper "shared" row: one set of layers
    encoder_causal: bool = False      # Encoder self-attention left-to-right only (BERT
    #   Table 5's "LTR" rows; pretrain and fine-tune with it)
    fully_visible_prefix: bool = True  # prefix LM: `decoder_causal_attention` opens the prefix;
    #   False keeps it causal (T5 Table 2's "Language model" on inputs+targets; flags then
    #   only mark the prompt)

    attention_scale: str = "sqrt"     # "sqrt": q·k / sqrt(head_dim); "folded": in q init (T5)
    attention_kernel: str = "auto"    # xla | cudnn (jax.nn.dot_product_attention) | splash
    #   (TPU Pallas kernel) | auto: splash on TPU, cuDNN on GPU, XLA on CPU (attention_kernels.py)
    attention_structure: bool = False  # cuDNN kernel: causality as is_causal, right padding
    #   as sequence lengths (packed rows: the dense mask), T5's bias kept [1, heads, q, k];
    #   no effect with other kernels (attention_kernels.cudnn_mask)
    prefix_length: int = 0            # prefix tuning (Li & Liang 2021): learned key/value
    #   slots [prefix_length, heads, head_dim] before every self-attention's keys; 0 = none
    adapter_size: int = 0             # Houlsby et al. 2019 adapters: a bottleneck of this
    #   width after each layer's attention and feed-forward outputs; 0 = none

    dropout_rate: float = 0.1
    attention_dropout_rate: Optional[float] = None  # defaults to dropout_rate
    mlp_dropout_rate: float = 0.0     # inside the feed-forward, after the activation (T5)

    scan_layers: bool = False         # nn.scan over layers: compile time flat in depth
    remat_policy: str = "none"        # none | full | dots | dots_with_no_batch_dims |
    #   save_qkv_proj (keep the q/k/v projections, recompute the rest of a layer) |
    #   save_qkv_out_proj (and the attention's output projection), as MaxText's policies
    loss_chunk_tokens: int = 0        # > 0: the output projection and cross entropy run over
    #   chunks of about this many tokens, each recomputed in the backward pass, so the
    #   [tokens, vocab] logits never exist at once (T5, GPT, BERT's MLM; losses.py); 0 = off

    dtype: str = "float32"            # float32 | bfloat16 (bf16 matmul inputs, float32
    #   accumulation, norms, softmax and loss) | auto (bfloat16 where this device runs it
    #   faster: TPU, GPUs from Ampere, CPUs with AVX512_BF16/AMX; resolved when built)
    param_dtype: str = "float32"      # parameters stay float32
    kernel_init: str = "variance_scaling"  # T5 (fan-in scaled) | "normal" (BERT, GPT-2)
    initializer_range: float = 0.02   # std of the "normal" init

    # Mixture of experts (t2t/nn/moe.py): Switch (top-1, Fedus et al. 2021) or GShard
    # (top-2, Lepikhin et al. 2020) feed-forward layers; 0 experts = dense everywhere.
    moe_num_experts: int = 0
    moe_top_k: int = 1                # 1 = Switch, 2 = GShard (top-2 gates renormalised)
    moe_every: int = 2                # layer i is MoE when i % moe_every == moe_every - 1
    moe_d_ff: int = 0                 # an expert's hidden width; 0 = d_ff
    moe_capacity_factor: float = 1.25  # expert buffer = factor * k * tokens / experts
    moe_eval_capacity_factor: float = 2.0  # the same without dropout (evaluation, decoding)
    moe_min_capacity: int = 4         # buffer floor (never above the tokens of a group)
    moe_router_jitter: float = 0.0    # Switch: router inputs times U(1-eps, 1+eps) in training
    moe_load_balancing_weight: float = 0.01  # Switch eq. 4's alpha
    moe_router_z_loss_weight: float = 0.001  # ST-MoE's c_z

    # Narang et al. 2021 ("Do Transformer Modifications Transfer?"): residuals, synthetic
    # attention, recurrence, low-rank attention.
    residual_scaling: str = "none"    # "rezero" (alpha F(x), alpha=0 at init) | "fixup" (its
    #   init, scalar multipliers and biases; norm_type="none"): t2t/nn/residual.py
    synthesizer: str = "none"         # self-attention from synthetic logits (Tay et al. 2020):
    #   dense | dense_plus | dense_plus_alpha | factorized | random | random_plus |
    #   random_plus_alpha (t2t/nn/synthesizer.py); "none" = dot-product attention
    synthesizer_length: int = 0       # ℓ of the dense/random logits (longest self-attention
    #   length); 0 = max_length
    synthesizer_rank: int = 8         # k of the factorized random synthesizer R1·R2ᵀ
    universal_steps: int = 0          # Universal Transformer (Dehghani et al. 2019): one shared
    #   layer per stack applied this many times (t2t/nn/universal.py); 0 = a plain stack
    universal_act: bool = False       # adaptive computation time (halting per position)
    universal_act_threshold: float = 0.99  # halt once the summed probability passes this
    universal_ponder_weight: float = 0.01  # ponder cost's weight in the loss
    linformer_k: int = 0              # Linformer (Wang et al. 2020): encoder self-attention keys
    #   and values projected along the length to k (t2t/nn/linformer.py); 0 = off
    # Sparse encoder self-attention (t2t/nn/sparse_attention.py): Longformer / BigBird.
    attention_pattern: str = "dense"  # dense | sliding_window (Longformer) | block_sparse (BigBird)
    attention_window: Sequence[int] = (512,)  # Longformer full window (even), one value or
    #   one per encoder layer, as HF's attention_window
    global_projections: bool = True   # Longformer's separate query/key/value_global
    max_global_tokens: int = 64       # Longformer: global tokens a row may have (a static
    #   bound: later ones attend locally); HF-compatible logits size it to their input
    sparse_block_size: int = 64       # BigBird block_sparse: tokens per block (HF block_size)
    num_random_blocks: int = 3        # BigBird: random key blocks per query block (t2t/nn/
    #   block_sparse.py)
    random_blocks_seed: int = 0       # BigBird: the random plan is drawn from (seed, layer, head)

    # Narang et al. 2021 ("Do Transformer Modifications Transfer?"), sharing and embeddings.
    share_layers_in: str = "both"     # with share_layers: "both" stacks, "encoder", "decoder"
    share_input_embeddings: bool = True  # T5: encoder and decoder read one token table
    adaptive_input: bool = False      # Baevski & Auli 2019 token embeddings (adaptive_input.py)
    output_layer: str = "softmax"     # softmax | adaptive_softmax (Grave et al. 2017) |
    #   mixture_of_softmaxes (Yang et al. 2018); t2t/nn/adaptive_softmax.py, mixture_of_softmaxes.py
    adaptive_cutoffs: Sequence[int] = ()  # vocabulary cluster bounds (ids by frequency)
    adaptive_factor: float = 4.0      # cluster i is d_model / factor**i wide
    adaptive_softmax_projection: bool = True  # False: every cluster d_model wide, unprojected
    #   (tie_embeddings ties adaptive input and softmax, Baevski & Auli 2019)
    mos_num_softmaxes: int = 4        # K of the mixture of softmaxes
    transparent_attention: bool = False  # Bapna et al. 2018: cross-attention reads a learned
    #   mix of every encoder layer (t2t/nn/transparent.py)
    funnel_blocks: Sequence[int] = ()  # Dai et al. 2020: encoder layers per block, stride-2
    #   pooling between blocks (t2t/nn/funnel.py); () = no pooling
    pkm_layers: Sequence[int] = ()    # Lample et al. 2019: decoder layers whose feed-forward
    #   is a product-key memory (t2t/nn/product_key.py)
    pkm_num_keys: int = 512           # sub-keys per half: n² memory slots
    pkm_key_dim: int = 256            # query width (two halves of d_k / 2)
    pkm_heads: int = 4
    pkm_topk: int = 32
    convolution: str = "none"         # Wu et al. 2019 in place of self-attention: lightweight |
    #   dynamic (t2t/nn/lightweight_conv.py); "none" = attention
    conv_kernel_size: int = 9         # k (Narang et al. appendix B: width 9)
    conv_groups: int = 0              # channels sharing a kernel come in this many groups;
    #   0 = num_heads (Wu et al.), d_model = a kernel per channel (Narang et al.'s layer)
    conv_pointwise: bool = False      # a pointwise d -> d map after the taps (separable conv)
    layer_type: str = "transformer"   # "weighted": Ahmed et al. 2017's branched attention
    #   (t2t/nn/weighted.py); "evolved": So et al. 2019's cells (t2t/nn/evolved.py)

    def __post_init__(self):
        _check_choice("norm_type", self.norm_type, NORM_TYPES)
        _check_choice("position_embedding", self.position_embedding, POSITION_TYPES)
        _check_choice("attention_scale", self.attention_scale, ATTENTION_SCALES)
        _check_choice("attention_pattern", self.attention_pattern, ATTENTION_PATTERNS)
        _check_choice("remat_policy", self.remat_policy, REMAT_POLICIES)
        _check_choice("kernel_init", self.kernel_init, KERNEL_INITS)
        _check_choice("dtype", self.dtype, DTYPES)
        if self.dtype == "auto":   # host detection (reads /proc/cpuinfo): t2t/precision.py
            from t2t.precision import resolve_dtype
            object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        if self.share_encoder_decoder and self.scan_layers:
            raise ValueError("share_encoder_decoder=True needs scan_layers=False")
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        if self.loss_chunk_tokens < 0:
            raise ConfigError(f"loss_chunk_tokens must be >= 0, got {self.loss_chunk_tokens}")
        if self.loss_chunk_tokens and (self.moe_num_experts or self.universal_act
                                       or self.output_layer != "softmax"):
            raise ConfigError("loss_chunk_tokens chunks a plain softmax output layer's loss "
                              "alone (no mixture-of-experts router loss, no ACT ponder cost, "
                              "output_layer='softmax'); set loss_chunk_tokens=0")
        if self.prefix_length < 0 or self.adapter_size < 0:
            raise ValueError(f"prefix_length and adapter_size must be >= 0, got "
                             f"{self.prefix_length} and {self.adapter_size}")
        if self.embedding_dim is not None and self.embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be positive, got {self.embedding_dim}")
        if self.position_embedding == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")
        if self.moe_num_experts:
            from t2t.nn.moe import check_moe_config   # the checks live beside the layer
            check_moe_config(self)
        self._check_narang_options()
        self._check_part_a_options()

    def _check_narang_options(self) -> None:
        """Narang et al. 2021 options: choices, then the layers' own checks."""
        for name in ("adaptive_cutoffs", "funnel_blocks", "pkm_layers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_choice("share_layers_in", self.share_layers_in, SHARE_LAYERS_IN)
        _check_choice("output_layer", self.output_layer, OUTPUT_LAYERS)
        if self.share_encoder_decoder and self.share_layers_in != "both":
            raise ConfigError("share_encoder_decoder=True shares both stacks; set "
                              "share_layers_in='both'")
        if self.adaptive_input or self.output_layer == "adaptive_softmax":
            from t2t.nn.adaptive_softmax import check_adaptive_config
            check_adaptive_config(self)
        if self.output_layer == "mixture_of_softmaxes" and self.mos_num_softmaxes < 1:
            raise ConfigError(f"mos_num_softmaxes must be >= 1, got {self.mos_num_softmaxes}")
        if self.transparent_attention and (self.scan_layers or self.funnel_blocks):
            raise ConfigError("transparent_attention needs every encoder layer's output: set "
                              "scan_layers=False and funnel_blocks=()")
        if self.funnel_blocks:
            from t2t.nn.funnel import check_funnel_config
            check_funnel_config(self)
        if self.pkm_layers:
            from t2t.nn.product_key import check_pkm_config
            check_pkm_config(self)
        _check_choice("convolution", self.convolution, CONVOLUTIONS)
        _check_choice("attention_kernel", self.attention_kernel, ATTENTION_KERNELS)
        _check_choice("layer_type", self.layer_type, LAYER_TYPES)
        if self.layer_type == "weighted":
            from t2t.nn.weighted import check_weighted_config
            check_weighted_config(self)
        elif self.layer_type == "evolved":
            from t2t.nn.evolved import check_evolved_config
            check_evolved_config(self)
        if self.convolution != "none":
            from t2t.nn.lightweight_conv import check_convolution_config
            check_convolution_config(self)

    def _check_part_a_options(self) -> None:
        """Residual scaling, synthesizer, Universal Transformer and Linformer options."""
        _check_choice("residual_scaling", self.residual_scaling, RESIDUAL_SCALINGS)
        _check_choice("synthesizer", self.synthesizer, SYNTHESIZERS)
        if self.residual_scaling != "none":
            from t2t.nn.residual import check_residual_config
            check_residual_config(self)
        if self.synthesizer != "none":
            from t2t.nn.synthesizer import check_synthesizer_config
            check_synthesizer_config(self)
        if self.universal_steps:
            from t2t.nn.universal import check_universal_config
            check_universal_config(self)
        if self.linformer_k:
            from t2t.nn.linformer import check_linformer_config
            check_linformer_config(self)
        if self.attention_pattern != "dense":
            from t2t.nn.sparse_attention import check_sparse_config
            check_sparse_config(self)
        if self.attention_pattern == "block_sparse":
            from t2t.nn.block_sparse import check_block_sparse_config
            check_block_sparse_config(self)

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def attn_dropout_rate(self) -> float:
        if self.attention_dropout_rate is None:
            return self.dropout_rate
        return self.attention_dropout_rate

    @property
    def is_gated(self) -> bool:
        return len(self.mlp_activations) > 1

    def replace(self, **changes) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """A ConfigError (a ValueError the command line prints as one line) for a bad choice."""
    if value not in choices:
        raise ConfigError(f"TransformerConfig.{name}={value!r}; choose one of {list(choices)}")
