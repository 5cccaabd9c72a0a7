"""Running jobs in-process against the operator's Dagster instance, and that instance's storage."""
