"""The built-in loggers (local run directory, console, W&B, TensorBoard, MLflow) and what they share.

Each is a plugin registered in ``telescope.core.builtin.loggers`` and imported only when a run
enables it.
"""
