"""Health test setup: this folder's helpers importable (--import-mode=importlib keeps it off sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
