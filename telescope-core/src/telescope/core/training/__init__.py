"""What every trainer backend shares (FSDP, Megatron, third-party): step timing, micro-batch
tensors, process-group setup. Import the submodules; this package imports nothing (no torch)."""
