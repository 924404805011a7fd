# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # mixle in a notebook: open a volume, sample, plot, load into JAX
#
# This notebook walks through mixle end to end on a small synthetic scan: write it to
# zarr, open it lazily, look at how it is stored, cut random and label-driven patches,
# draw where they fall, batch them with `mixle.Loader` and hand a batch to a jitted JAX
# step. CI runs it top to bottom in a fresh kernel (`tests/test_notebook.py`), so every
# cell works as shown.
#
# It needs mixle with its zarr, plot and jax extras, installed from a clone of the
# repository: `python3 -m pip install -e ".[zarr,plot,jax]"` in the clone's root folder (the
# name `mixle` on the package index belongs to an unrelated project, so installing `mixle`
# by name fetches a different library). Everything is written to a temporary folder that
# the last cell removes. `docs/notebook.py` is the same notebook as a
# jupytext script (edit either, then `jupytext --sync docs/notebook.py`).

# %%
# %matplotlib inline
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import zarr
from IPython.display import display

import mixle
import mixle.plot
from mixle.inspection import inspect_store
from mixle.jax import JaxLoader

workdir = Path(tempfile.mkdtemp(prefix="mixle-notebook-"))

# %% [markdown]
# ## 1. A small example volume
#
# A 96 x 128 x 128 int16 "CT scan" in Hounsfield units: air around an ellipsoidal body,
# two bright spheres (the "lesions" a model should learn), and noise. A label array marks
# the spheres. Both go into one zarr group, stored in 32³ chunks; mixle never needs the
# whole array in memory, but this one is small enough to build with NumPy.

# %%
shape = (96, 128, 128)
z, y, x = np.meshgrid(*(np.linspace(-1, 1, n, dtype=np.float32) for n in shape), indexing="ij")
rng = np.random.default_rng(0)
ct = np.where((z / 0.9) ** 2 + (y / 0.7) ** 2 + (x / 0.8) ** 2 < 1, 40.0, -1000.0)
label = np.zeros(shape, dtype=np.uint8)
for centre, radius in [((0.2, 0.1, -0.3), 0.15), ((-0.3, -0.2, 0.35), 0.1)]:
    inside = (z - centre[0]) ** 2 + (y - centre[1]) ** 2 + (x - centre[2]) ** 2 < radius**2
    ct[inside] = 300.0
    label[inside] = 1
ct = np.rint(ct + rng.normal(0, 15, shape)).astype(np.int16)

group = zarr.open_group(workdir / "scan.zarr", mode="w")
group.create_array("ct", shape=shape, chunks=(32, 32, 32), dtype="int16")[:] = ct
group.create_array("label", shape=shape, chunks=(32, 32, 32), dtype="uint8")[:] = label
print(f"{label.mean():.2%} of the voxels are lesion")

# %% [markdown]
# ## 2. Open it lazily
#
# `mixle.read_zarr` reads metadata only. Indexing follows NumPy and returns new arrays.

# %%
vol = mixle.read_zarr(workdir / "scan.zarr", component="ct")
print(vol)
print("shape", vol.shape, "dtype", vol.dtype, "chunks", vol.chunks)
print("centre voxel:", vol[48, 64, 64], "HU")

# %% [markdown]
# ## 3. How it is stored
#
# `mixle.inspection.inspect_store` (the library behind `mixle inspect`) reads metadata and
# object sizes, never chunk data, and says what a patch of a given size costs to read:
# how many chunks it touches and how many bytes are decoded per byte of patch.

# %%
report = inspect_store(workdir / "scan.zarr", patch=32)
for array in report.arrays():
    cost = array.patch_cost
    print(
        f"{array.path}: {array.shape} {array.dtype}, chunks {array.chunks}, "
        f"codecs {', '.join(array.codecs)}; a 32³ patch touches {cost.chunks_touched:.1f} "
        f"chunks, {cost.read_amplification:.1f}x its size decoded"
    )

# %% [markdown]
# ## 4. Random patches
#
# `PatchSampler` places patch `i` as a pure function of `(seed, i)`: the same corners in
# every process and on every machine, with no state and no I/O until a patch is read.

# %%
sampler = mixle.PatchSampler(vol, patch_size=32, num_patches=1000, seed=0)
patch, corner = sampler[0]
print("patch", patch.shape, patch.dtype, "at corner", corner)
patches, corners = sampler.get_batch(np.arange(8))
print("batch", patches.shape, corners.shape)

# %% [markdown]
# Where do they fall? `mixle.plot.plot_sampler` draws the footprints of the patches that
# cross one slice; the picture reads only that slice.

# %%
ax = mixle.plot.plot_sampler(sampler, axis=0, max_patches=60, axis_names="zyx")
display(ax.figure)

# %% [markdown]
# ## 5. Patches centred on the lesions
#
# Lesions are under 1% of the volume, so uniform patches rarely see one. With
# `labels=` and `label_probabilities=` half of the patches are centred on a lesion voxel.
# A dict of arrays is sampled at one place, so each patch comes with its label patch.

# %%
lab = mixle.read_zarr(workdir / "scan.zarr", component="label")
weighted = mixle.PatchSampler(
    {"image": vol, "label": lab},
    patch_size=32,
    num_patches=1000,
    labels="label",
    label_probabilities={0: 0.5, 1: 0.5},
    seed=0,
)
batch = weighted.get_batch(np.arange(200))
centred = batch["label"][:, 16, 16, 16]
print(sorted(batch), batch["image"].shape)
print(f"{centred.mean():.0%} of 200 patches are centred on a lesion (asked for 50%)")

# %% [markdown]
# `plot_sampling_density` draws where the sampler's patch centres land (right) beside
# where the label map says they should (left), summed along z.

# %%
axes = mixle.plot.plot_sampling_density(weighted, num_draws=2000, axis_names="zyx")
display(axes[0].figure)

# %% [markdown]
# ## 6. The chunk grid
#
# Reads happen chunk by chunk: a batch of patches decodes each chunk it touches once, and
# decoded chunks are kept in a shared byte-budgeted cache. `plot_chunk_grid` shows the
# chunk boundaries over a slice.

# %%
ax = mixle.plot.plot_chunk_grid(vol, axis=1, axis_names="zyx")
display(ax.figure)

# %% [markdown]
# ## 7. Batches with `mixle.Loader`
#
# The Loader shuffles per epoch, reads ahead in threads and can resume at exactly the next
# batch from a small state dict.

# %%
loader = mixle.Loader(sampler, batch_size=16, shuffle=True, seed=1)
print(len(loader), "batches per epoch")
with loader:
    batches = iter(loader)
    for _ in range(3):
        patches, coords = next(batches)
    state = loader.state_dict()  # resumes at batch 3
print("batch", patches.shape, patches.dtype, "corners", coords.shape, coords.dtype)
print("resume state:", state)

# %% [markdown]
# ## 8. Into JAX
#
# `mixle.jax.JaxLoader` takes the Loader's options, keeps a couple of batches on the
# device ahead of the loop, and with `drop_last="pad"` gives every batch one static shape
# (plus a mask of the real rows), so the step compiles once.

# %%
jax_loader = JaxLoader(weighted, batch_size=16, shuffle=True, seed=1, drop_last="pad")


@jax.jit
def step(total, batch):
    image = batch["image"].astype(jnp.float32)
    per_patch = image.mean(axis=(1, 2, 3))
    return total + jnp.where(batch["mask"], per_patch, 0.0).sum()


total = jnp.zeros(())
with jax_loader:
    for batch in jax_loader:
        total = step(total, batch)
print(f"mean patch intensity {float(total) / len(weighted):.1f} HU on {jax.devices()[0]}")
print("batch shape", batch["image"].shape, batch["image"].dtype, type(batch["image"]).__name__)

# %% [markdown]
# That is the whole path: a store on disk, lazy patches, pictures of what is sampled,
# batches, and a jitted step on the device. Clean up the temporary folder:

# %%
vol.close()
lab.close()
shutil.rmtree(workdir)
