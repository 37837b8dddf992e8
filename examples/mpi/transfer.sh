#!/bin/sh
# One shard of an intact plan per MPI rank (Open MPI's mpirun; MPICH's
# mpiexec works the same way, intact reading PMI_RANK instead of
# OMPI_COMM_WORLD_RANK), then one merged report.
#
#   examples/mpi/transfer.sh plan.json reports --key-file ~/.intact/key
#
# The plan comes first (`intact plan SRC --shards N --to HOST:PORT,... -o
# plan.json`); this runs N ranks, N read from the plan. Arguments after the
# reports directory go to `intact send`. MPIRUN_ARGS adds options to
# mpirun (a hostfile, --oversubscribe, --allow-run-as-root); INTACT names
# the intact binary if it is not on PATH. Exit status: 0 only if every
# shard reported and nothing failed (the merge's verdict).
set -eu
plan=${1:?usage: transfer.sh PLAN REPORT_DIR [intact send options]}
reports=${2:?usage: transfer.sh PLAN REPORT_DIR [intact send options]}
shift 2
intact=${INTACT:-intact}
shards=$("$intact" report shards "$plan")
mkdir -p "$reports"
status=0
# shellcheck disable=SC2086 # MPIRUN_ARGS is split on purpose
mpirun ${MPIRUN_ARGS:-} -np "$shards" "$intact" send --plan "$plan" \
  --report "$reports/shard-{shard}.json" -q "$@" || status=$?
"$intact" report merge --plan "$plan" "$reports"/shard-*.json || status=$?
exit "$status"
