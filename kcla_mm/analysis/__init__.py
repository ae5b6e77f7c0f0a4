"""Analysis helpers behind tools/analysis/ (no plotting here)."""
