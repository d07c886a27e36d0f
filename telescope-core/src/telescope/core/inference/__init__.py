"""Inference engines: one protocol, two engines, and the client the orchestrator uses.

- ``protocol``: request/response models and endpoint paths (light).
- ``settings``: engine kwargs models and how each run-config field is honoured (light).
- ``auto``: ``inference_engine: auto`` resolution (light).
- ``launcher``: server processes and the ``InferenceEngine`` base (light).
- ``client``: async HTTP client (aiohttp).
- ``transformers_engine``: the embedded engine (torch, transformers, aiohttp).
- ``vllm_engine``: vLLM launch arguments, engine and worker extension (vLLM itself is not run in CI).

Importing this package imports nothing heavy.
"""

from __future__ import annotations
