"""telescope.megatron: the Megatron-Core trainer backend."""
