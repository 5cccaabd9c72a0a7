"""One module per operator action, without Dagster, named like its command where it has one: discover,
rediscover, prepare, install, status, prune; and what they share (rollout, lease, pool, host_log)."""
