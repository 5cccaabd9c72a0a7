"""The code location's names that other layers use: job names and run tags, spelled once.

Dagster keeps history by these names, so they never change with the package layout.
"""

from __future__ import annotations

DISCOVERY_JOB = "discovery_job"
PREPARE_JOB = "prepare_job"
INSTALL_JOB = "install_job"
# Install and rollback runs say what went where in the run list.
REVISION_TAG = "narwhal/revision"
DEPLOYMENT_TAG = "narwhal/deployment_id"
# Every run started by `deploy-hosts` carries the command that started it, so the UI's run list says why.
COMMAND_TAG = "narwhal/command"
# Runs started by a schedule or sensor say which (`reverify`, `weekly-full-rehash`, ...).
TRIGGER_TAG = "narwhal/trigger"
# Every asset that works on hosts over SSH is in this concurrency pool (the instance may limit it).
HOST_POOL = "narwhal_hosts"
OWNERS = ["team:narwhal-deploy"]
