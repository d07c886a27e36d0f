"""telescope.sandboxes."""
