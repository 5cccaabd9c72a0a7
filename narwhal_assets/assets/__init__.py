"""Dagster layer: asset bodies call the core and adapters and report secret-free metadata."""
