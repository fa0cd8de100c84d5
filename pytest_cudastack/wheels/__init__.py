"""wheels floor."""
