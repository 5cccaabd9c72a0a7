"""What discovery observed and records: observations, digests, the run's manifest, drift, watch, retention."""
