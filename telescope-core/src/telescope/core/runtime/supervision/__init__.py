"""Supervision of a run: healing servers, recovering trainers, liveness, stall diagnosis,
preflight checks and guarded hook calls (docs/faults.md).
"""
