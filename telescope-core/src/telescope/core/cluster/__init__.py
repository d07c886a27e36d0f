"""Cluster plumbing below everything that runs a process: addresses, port claims, signals, threads.

The lowest layer of the runtime's helpers (docs/architecture.md): it imports only the config, so
inference servers, the rollout pipeline and the runtime can all use it. Light at import.
"""
