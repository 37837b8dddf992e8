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
# the intact binary if it is not on PATH. Exit status: the merge's, 0 only
# if every shard reported and nothing failed.
set -eu
plan=${1:?usage: transfer.sh PLAN REPORT_DIR [intact send options]}
reports=${2:?usage: transfer.sh PLAN REPORT_DIR [intact send options]}
shift 2
intact=${INTACT:-intact}
shards=$("$intact" report shards "$plan")
mkdir -p "$reports"
# Reports of an earlier run must not stand for this one.
rm -f "$reports"/shard-*.json
# Every rank ends with status 0, whatever its shard did: mpirun aborts all
# ranks when one fails, and the others' transfers must go on. What each
# shard did is in its report, and the merge below decides.
# shellcheck disable=SC2086 # MPIRUN_ARGS is split on purpose
mpirun ${MPIRUN_ARGS:-} -np "$shards" sh -c '"$@" || true' sh \
  "$intact" send --plan "$plan" --report "$reports/shard-{shard}.json" -q "$@"
exec "$intact" report merge --plan "$plan" "$reports"/shard-*.json
