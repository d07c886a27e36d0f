"""Example third-party Telescope environment package."""
