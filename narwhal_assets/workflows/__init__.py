"""One module per operator action, without Dagster: discover, rediscover, prepare, install, deployments."""
