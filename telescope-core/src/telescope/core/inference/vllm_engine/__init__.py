"""The ``vllm`` engine: vLLM's OpenAI server launched from the resolved config, plus a worker extension
that receives Telescope weight syncs.

NOT RUN HERE: vLLM's wheel is CUDA-only and cannot be installed on Telescope's CPU CI. What is
tested without vLLM: the launch arguments (``args``), the engine's command and environment, the
client against a fake server speaking vLLM's JSON, and the receiving protocol (the same
``WeightReceiver`` the transformers engine runs). What has not run: ``vllm serve`` itself, the
worker extension inside vLLM workers, NCCL transfers into vLLM, and LoRA adapters served by vLLM
(``lora``: written and tested against vLLM 0.17.1's source, docs/lora.md#vllm).
"""

from __future__ import annotations
