"""telescope.cli: the ``telescope`` command."""
