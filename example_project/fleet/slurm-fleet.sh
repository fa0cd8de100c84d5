#!/bin/sh
# One cudastack snapshot per node of a Slurm allocation, then `cudastack fleet` over them.
#
#   sbatch --nodes=16 --time=5 example_project/fleet/slurm-fleet.sh /opt/venvs/train
#   (or inside `salloc --nodes=16`: sh slurm-fleet.sh /opt/venvs/train)
#
# $1: the venv (or site-packages directory) the jobs use, as every node sees it (default: /opt/venv).
# CUDASTACK_FLEET_DIR: a directory every node can write (default: ./cudastack-fleet/JOBID, on a shared file
# system). CUDASTACK_FLEET_ARGS: more `cudastack fleet` arguments (--against env.json, --format junit, ...).
# CUDASTACK_EXE: the cudastack command (default: cudastack on PATH).
# Exit status: cudastack fleet's (0 one stack everywhere, 1 groups differ or errors, 2 a node wrote no snapshot).
#SBATCH --job-name=cudastack-fleet
#SBATCH --ntasks-per-node=1
set -eu
venv=${1:-/opt/venv}
out=${CUDASTACK_FLEET_DIR:-$PWD/cudastack-fleet/${SLURM_JOB_ID:-manual}}
mkdir -p "$out"
# one task per node; each writes <hostname>.json (the snapshot names its host too). The snapshot reads files only:
# no GPU is allocated, and a warm ELF cache makes it about a second per node.
# shellcheck disable=SC2016  # expanded on each node, by its own shell
srun --ntasks-per-node=1 --nodes="${SLURM_JOB_NUM_NODES:-1}" \
    sh -c 'exec "$0" snapshot --site "$1" -o "$2/$(hostname).json"' "${CUDASTACK_EXE:-cudastack}" "$venv" "$out"
# shellcheck disable=SC2086  # CUDASTACK_FLEET_ARGS is a list of words
exec "${CUDASTACK_EXE:-cudastack}" fleet "$out" ${CUDASTACK_FLEET_ARGS:-}
