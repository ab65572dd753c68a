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
# # Sharding: one mesh, one table of logical-axis rules
#
# Model code names only *logical* axes (`embed`, `mlp`, `heads`, `vocab`, ...); one table in
# `t2t/train/partitioning.py` maps them onto the mesh axes `data`, `fsdp` and `tensor`. This
# notebook fakes 8 devices on the CPU, builds three meshes and shows where the real
# parameters of a tiny T5 land on each.
#
# Settings: nothing to train, so the test (`T2T_NOTEBOOK_CI=1`) and the committed outputs
# run the same cells.

# %%
import os

# 8 fake CPU devices: must be set before JAX starts.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
from IPython.display import Markdown, display

from t2t.models.families import make_model
from t2t.nn.config import TransformerConfig
from t2t.train import partitioning

print(jax.device_count(), "devices:", jax.devices())

# %% [markdown]
# ## The logical-axis rules
#
# The first matching rule wins for each dimension, and one array uses a mesh axis at most
# once: `batch` comes first, so an activation `[batch, length, embed]` shards its batch over
# `data` and `fsdp`, and its `embed` stays whole. Parameters have no batch dimension: their
# `embed` goes over `fsdp` (ZeRO-3 style), and `mlp`, `heads` and `vocab` over `tensor`
# (Megatron style).

# %%
rows = [f"| `{name}` | {axes if axes is None else f'`{axes}`'} |"
        for name, axes in partitioning.DEFAULT_RULES]
display(Markdown("\n".join(["| logical axis | mesh axes |", "|---|---|", *rows])))

# %% [markdown]
# ## A tiny T5 and its logical names
#
# Every parameter carries its logical names (`nn.with_logical_partitioning`); `jax.eval_shape`
# reads them without allocating anything.

# %%
config = TransformerConfig(vocab_size=256, d_model=64, num_heads=4, head_dim=16, d_ff=128,
                           num_encoder_layers=2, num_decoder_layers=2)
model = make_model("t5", config)
batch = {"encoder_input_tokens": jnp.ones((8, 16), jnp.int32),
         "decoder_input_tokens": jnp.ones((8, 8), jnp.int32),
         "decoder_target_tokens": jnp.ones((8, 8), jnp.int32)}
rng = jax.random.PRNGKey(0)
boxed = jax.eval_shape(model.init, rng, batch)
flat = jax.tree_util.tree_flatten_with_path(
    boxed, is_leaf=lambda x: hasattr(x, "names"))[0]
for path, leaf in flat:
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    if "layer_" not in name or "layer_0" in name:          # the first layer of each stack
        print(f"{name:<62} {str(leaf.value.shape):<14} {leaf.names}")

# %% [markdown]
# ## Three meshes of the same 8 devices
#
# `MeshConfig(data, fsdp, tensor)`: pure data parallelism (parameters replicated), fully
# sharded data parallelism (parameters split over `embed`), and a 2×2×2 mix with tensor
# parallelism. `init_sharded` initialises each parameter directly in its sharding: no
# device ever holds a full copy.

# %%
meshes = {"data": partitioning.MeshConfig(data=8, fsdp=1, tensor=1),
          "fsdp": partitioning.MeshConfig(data=1, fsdp=8, tensor=1),
          "data × fsdp × tensor": partitioning.MeshConfig(data=2, fsdp=2, tensor=2)}
sharded = {}
for label, mesh_config in meshes.items():
    mesh = partitioning.make_mesh(mesh_config)
    params, shardings = partitioning.init_sharded(model.init, rng, batch, mesh=mesh)
    sharded[label] = params
    print(f"{label:<22} mesh {dict(mesh.shape)}")

# %% [markdown]
# ### The feed-forward input kernel `[embed, mlp]` (64 × 128) of the first encoder layer
#
# Each box is one shard; the numbers are the devices holding it.

# %%
def kernel(params):
    return params["encoder"]["layers"]["layer_0"]["mlp"]["wi_0"]["kernel"]


for label, params in sharded.items():
    print(f"{label}: {kernel(params).sharding.spec}")
    jax.debug.visualize_array_sharding(kernel(params))

# %% [markdown]
# ### The token embedding `[vocab, embed]` (256 × 64)
#
# Shared by the encoder, the decoder and (tied) the output logits: `vocab` over `tensor`,
# `embed` over `fsdp`.

# %%
for label, params in sharded.items():
    table = params["token_embedder"]["embedding"]
    print(f"{label}: {table.sharding.spec}")
    jax.debug.visualize_array_sharding(table)

# %% [markdown]
# ### Per device
#
# What one device stores of the whole model on each mesh: all of it with pure data
# parallelism, an eighth with `fsdp=8`.

# %%
total = sum(x.size for x in jax.tree.leaves(sharded["data"]))
for label, params in sharded.items():
    local = sum(x.addressable_shards[0].data.size for x in jax.tree.leaves(params))
    print(f"{label:<22} {local:>7,} of {total:,} parameters on device 0 "
          f"({local / total:.0%})")
