"""``telescope ui``: a live web dashboard over run directories (docs/dashboard.md).

``data`` is the data API (runs, metrics, rollouts, events, logs, system, evals read
incrementally from the run directory); ``server`` serves it with the static page.
"""
