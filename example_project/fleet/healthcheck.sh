#!/bin/sh
# A Slurm HealthCheckProgram (slurm.conf: HealthCheckProgram=/etc/slurm/cudastack-health.sh,
# HealthCheckInterval=600) that drains a node whose CUDA stack would fail jobs: a driver upgraded without a
# reboot (kernel module vs user-space libraries), CUDA libraries whose bytes are not their wheels', or a stack
# the reference environment would not run on. slurmd kills a health check after 60 s: this one gives cudastack
# $CUDASTACK_HEALTH_TIMEOUT seconds (default 40; about 1 s with a warm ELF cache, which persists in
# $CUDASTACK_CACHE_DIR) and passes the node when that runs out, rather than drain it for being slow.
#
# CUDASTACK_SITE: the venv the jobs use (default /opt/venv). CUDASTACK_REFERENCE: an environment's snapshot
# (cudastack snapshot --no-host where the image is built) the node must run. CUDASTACK_EXE: the cudastack
# command (default: cudastack on PATH). Exit 0 healthy, 1 drained.
set -u
site=${CUDASTACK_SITE:-/opt/venv}
state=${CUDASTACK_STATE_DIR:-/run/cudastack}
limit=${CUDASTACK_HEALTH_TIMEOUT:-40}
cudastack=${CUDASTACK_EXE:-cudastack}
node=$(hostname -s)
mkdir -p "$state" || exit 0
snapshot="$state/node.json"
if ! timeout "$limit" "$cudastack" snapshot --site "$site" -o "$snapshot" 2>"$state/snapshot.err"; then
    logger -t cudastack-health "no snapshot taken: $(tail -n 1 "$state/snapshot.err")" 2>/dev/null
    exit 0
fi
set -- "$snapshot"
if [ -n "${CUDASTACK_REFERENCE:-}" ]; then
    set -- "$@" --against "$CUDASTACK_REFERENCE"
fi
"$cudastack" fleet "$@" >"$state/fleet.txt" 2>&1
status=$?
if [ "$status" -eq 0 ]; then
    exit 0
fi
# the first error line, else the reason the environment would not run, as the drain reason
reason=$(grep -m 1 -e '^  ERROR' -e 'would NOT run' "$state/fleet.txt" | sed 's/^ *//' | cut -c 1-200)
[ -n "$reason" ] || reason="cudastack fleet exited $status (see $state/fleet.txt)"
"${SCONTROL:-scontrol}" update NodeName="$node" State=DRAIN Reason="cudastack: $reason"
exit 1
