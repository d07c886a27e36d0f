"""The ``vllm`` engine: vLLM's OpenAI server launched from the resolved config, plus a worker extension
that receives Telescope weight syncs.

NOT RUN HERE: vLLM's wheel is CUDA-only and cannot be installed on Telescope's CPU CI. What is
tested without vLLM: the launch arguments (``args``), the engine's command and environment, the
client against a fake server speaking vLLM's JSON, and the receiving protocol (the same
``WeightReceiver`` the transformers engine runs). What has not run: ``vllm serve`` itself, the
worker extension inside vLLM workers, and NCCL transfers into vLLM.
"""

from __future__ import annotations
