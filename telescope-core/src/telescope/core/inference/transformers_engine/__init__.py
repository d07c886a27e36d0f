"""The embedded ``transformers`` inference engine: a real OpenAI-compatible HTTP server per worker.

- ``sampling``: temperature/top-p sampling and the trainer's definition of a token logprob.
- ``kv``: a batched KV cache that sequences can join and leave between decode steps.
- ``scheduler``: sequences and the waiting queue (priority or first-come-first-served).
- ``core``: ``GenerationEngine``, the decode loop thread (batching, aborts, pause, weight updates).
- ``server``: the aiohttp application and the ``python -m`` entry point.
"""

from __future__ import annotations
