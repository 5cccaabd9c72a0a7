"""The `discovery` group: inventory, host keys, observations, digests, the discovered config set."""
