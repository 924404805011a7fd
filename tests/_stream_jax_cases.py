"""The stream Loader through JAX (``to_jax``, ``JaxLoader``), on two forced CPU devices.

Run by ``tests/test_streams.py`` in a fresh interpreter with
``XLA_FLAGS=--xla_force_host_platform_device_count=2``: a started JAX backend must stay out
of the main pytest process (it warns on every later ``os.fork()``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from _stream_sources import WIDTH, Counting  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import mixle  # noqa: E402
from mixle.jax import JaxLoader  # noqa: E402


def test_to_jax_yields_device_arrays_with_the_mask() -> None:
    jl = mixle.Loader(Counting(7), 2, drop_last="pad").to_jax()
    batches = list(jl)
    assert len(batches) == 4 and isinstance(batches[0]["x"], jax.Array)
    assert batches[-1]["mask"].tolist() == [True, False]
    assert jl.element_spec()["x"].shape == (2, WIDTH)
    with pytest.raises(TypeError, match="a stream has no length"):
        len(jl)


def test_jax_loader_over_a_stream_resumes() -> None:
    whole = [np.asarray(b["i"]).tolist() for b in JaxLoader(Counting(11), 3, num_epochs=2)]
    first = JaxLoader(Counting(11), 3, num_epochs=2)
    got = []
    for batch in first:
        got.append(np.asarray(batch["i"]).tolist())
        if len(got) == 5:
            state = json.dumps(first.state_dict())
            break
    again = JaxLoader(Counting(11), 3, num_epochs=2)
    again.load_state_dict(json.loads(state))
    got += [np.asarray(b["i"]).tolist() for b in again]
    assert got == whole and len(whole) == 8
    assert first.last_indices.tolist() == got[4] and first.last_epoch == 1


def test_a_sharded_stream_needs_batches_that_split_over_the_devices() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batches = list(JaxLoader(Counting(9), 4, sharding=sharding, drop_last="pad"))
    assert len(batches) == 3 and batches[0]["x"].sharding == sharding
    with pytest.raises(ValueError, match=r"multiple of 2 .*now 3"):
        JaxLoader(Counting(9), 3, sharding=sharding, drop_last="pad")
    with pytest.raises(ValueError, match="drop_last='pad' or True"):
        JaxLoader(Counting(9), 4, sharding=sharding)
