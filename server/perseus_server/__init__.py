"""Perseus."""
