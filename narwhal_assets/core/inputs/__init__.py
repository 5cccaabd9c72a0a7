"""The operator's inputs: `.env` and layered settings, the host inventory, management access values."""
