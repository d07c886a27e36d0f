"""Core's built-in plugins, registered before any entry point (see ``plugins.BUILTIN_PLUGINS``)."""
