"""Domain core: pure parsing, validation and rendering. No Dagster, no network."""
