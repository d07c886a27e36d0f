"""Fixtures of the inference tests: a private model cache and in-process servers on 127.0.0.1."""

from __future__ import annotations


def make_cfg(**overrides: object):  # type: ignore[no-untyped-def]
    """A run config for the tiny model; one torch thread keeps the 2-core CI machine responsive."""
    from telescope.core.testing import make_config

    # float32 servers: these tests compare logprobs and weights with float32 references exactly.
    base = {
        "model": "telescope/tiny",
        "max_model_len": 512,
        "ray_inference_cpus_per_worker": 1.0,
        "seed": 7,
        "inference_dtype": "float32",
    }
    return make_config(**{**base, **overrides})
