"""linker floor."""
