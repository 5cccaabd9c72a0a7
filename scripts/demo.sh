#!/usr/bin/env bash
# The README's demo: install everything, start a three-host simulated fleet (real sshd in network
# namespaces), then run the whole sequence against it: plan, discover, check-access, prepare, install, and a
# command in a role shell.
# `bash scripts/demo.sh stop` removes the fleet again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
demo="$repo/runs/demo"
fleet_dir="$demo/fleet"
checkout="$demo/checkout"

stop_fleet() {
  if [ -f "$fleet_dir/fleet.json" ]; then
    "$repo/.venv/bin/python" -m fleetsim stop --dir "$fleet_dir"
  fi
  rm -rf "$fleet_dir"
}

if [ "${1:-}" = "stop" ]; then
  stop_fleet
  echo "demo fleet stopped; the demo checkout stays in $checkout"
  exit 0
fi

source "$here/bootstrap.sh"
stop_fleet
# A new fleet has new hosts and host keys: start from a fresh demo checkout, or its saved inventory and
# trust store would (rightly) refuse them.
# The demo checkout is a clone of this repository: prepare ships one of its commits.
rm -rf "$checkout"
mkdir -p "$demo"
git clone -q "$repo" "$checkout"
chmod 0700 "$demo" "$checkout"
# The demo checkout's .env: destinations of the simulated hosts plus the engine settings.
python -m fleetsim start --dir "$fleet_dir" > "$checkout/.env"
cat >> "$checkout/.env" <<'ENV'
NARWHAL_ENGINE_IMAGE=narwhal/inference-engine:2025.11
NARWHAL_ENGINE_MODEL_NAME=demo-model
NARWHAL_MODEL_DIR=/srv/models/demo-model
NARWHAL_RUN_DIR=/var/tmp/narwhal-run
NARWHAL_FABRIC_INTERFACE=fab0
# The simulated hosts have no package index: link the checkout into .venv, then import from it.
NARWHAL_REMOTE_INSTALL="python -c 'import pathlib, site; pathlib.Path(site.getsitepackages()[0], \"checkout.pth\").write_text(str(pathlib.Path.cwd()) + chr(10))'"
NARWHAL_REMOTE_CHECK='python -I -c "import narwhal_assets.host.tools.fabric_budget"'
ENV
chmod 0600 "$checkout/.env"
export DAGSTER_HOME="$checkout/runs/dagster"

deploy="$repo/.venv/bin/deploy-hosts"
echo "== deploy-hosts plan"
"$deploy" --root "$checkout" plan
echo "== deploy-hosts discover"
"$deploy" --root "$checkout" discover
echo "== deploy-hosts check-access"
"$deploy" --root "$checkout" check-access
echo "== deploy-hosts prepare"
echo "NARWHAL_DEPLOYMENT_REVISION=$(git -C "$checkout" rev-parse HEAD)" >> "$checkout/.env"
run="$checkout/runs/deployment-env/demo-$(date -u +%Y%m%dT%H%M%SZ)"
"$deploy" --root "$checkout" prepare --out "$run"
echo "== deploy-hosts install (a lease on every host, stage every host, then activate them together)"
"$deploy" --root "$checkout" install --run "$run"
echo "== deploy-hosts install (again: everything verified and reused, nothing sent)"
"$deploy" --root "$checkout" install --run "$run"
echo "== deploy-hosts status (which deployment each host runs)"
"$deploy" --root "$checkout" status
echo "== deploy-hosts shell --run ... --role engine-2 --command ..."
"$deploy" --root "$checkout" shell --run "$run" --role engine-2 \
  --command 'printf "engine-2 on %s: port %s, python %s\n" "$(hostname)" "$NARWHAL_ENGINE_PORT" "$(command -v python)"'
cat <<MSG

Where to look:
  $checkout/config/            generated private inputs (hosts, known hosts, fleet, launch records, deployment.env)
  $checkout/runs/discovery/    observations, checkpoint digests, command logs per discovery run
  $checkout/runs/deployment-env/  prepared deployments: source.bundle, role files per host, manifest.json
  $run/logs/   install logs per host (the programs sent, stored once in programs/; exit status, output)
Try (each works as printed, from any directory):
  $deploy --root $checkout plan
  $deploy --root $checkout check-access --role engine-2
  $deploy --root $checkout status --json
  $deploy --root $checkout shell --current --role router                 # the router's role shell
  $deploy --root $checkout shell --role engine-2                          # a shell on the password host
  $deploy --root $checkout lease                                          # each host's deploy lease (free after the install)
  DAGSTER_HOME=$DAGSTER_HOME $deploy --root $checkout ui                  # the UI on 127.0.0.1:3000, Ctrl-C stops it
Stop the simulated fleet with: bash $repo/scripts/demo.sh stop
MSG
