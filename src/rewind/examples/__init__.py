"""The demo research pipeline and its real dataset."""
