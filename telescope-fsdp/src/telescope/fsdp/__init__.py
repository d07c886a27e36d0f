"""telescope.fsdp: the FSDP2 trainer backend (``train_backend: fsdp``).

Import ``telescope.fsdp.backend`` for the backend itself (it imports torch and transformers).
"""
