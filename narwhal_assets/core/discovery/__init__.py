"""What discovery observed and derives from it: observations, digests, drift, retention, deployment.env."""
