"""telescope.envs."""
