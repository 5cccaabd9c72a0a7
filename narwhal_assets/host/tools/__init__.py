"""Standalone, standard-library-only programs copied to engine hosts as `runs/deployment-tools/` snapshots."""
