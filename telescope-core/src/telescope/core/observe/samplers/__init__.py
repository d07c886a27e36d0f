"""Samplers that feed system and engine metrics into a run: CPU/memory/GPU, vLLM's Prometheus
endpoint, torch memory in trainer ranks and the OTLP receiver for vLLM request traces.
"""
