"""cuda floor."""
