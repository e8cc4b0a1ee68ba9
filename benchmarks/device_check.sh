#!/usr/bin/env bash
# One short, prepared check on a GPU machine, each step time-boxed so that a broken stack fails
# in seconds and a slow step cannot eat the others' time:
#
#   bash benchmarks/device_check.sh OUTDIR                 # every step, about 15 minutes on one H200
#   bash benchmarks/device_check.sh OUTDIR overhead accel  # only these (env and smoke always run)
#
#   env       JAX, Brax and the devices JAX sees
#   smoke     a short `tclock train` on pointmass_reach (the later steps run only if it passes)
#   overhead  benchmarks/diagnostics_overhead.py at 256 and 4096 envs: the iteration-time cost of
#             the gradient diagnostics behind the online critical batch, at the default cadence
#   sweep     the README's main job (`tclock sweep`, its defaults) with its wall time
#   accel     benchmarks/accelerator.py on one device: training env-steps/s beside the raw step
#
# Each step writes OUTDIR/<step>.txt; OUTDIR/steps.txt lists every step's exit code and seconds.
# The boxes come from one H200 (2026-12-04): 8 s for env, 35 s for smoke, about 150 s per overhead
# size (its five variants compile separately), and more than 150 s for the sweep's six sizes.
set -u
out=${1:?usage: bash benchmarks/device_check.sh OUTDIR [overhead sweep accel]}
shift
steps=${*:-overhead sweep accel}
wanted() { [[ " $steps " == *" $1 "* ]]; }
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1

step() {
    local name=$1 limit=$2
    shift 2
    local start rc
    start=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    echo "$name rc=$rc $(($(date +%s) - start))s" | tee -a "$out/steps.txt"
    tail -n 30 "$out/$name.txt"
    return $rc
}

step env 60 python3 -c "import jax, brax; print('jax', jax.__version__, 'brax', brax.__version__, jax.devices())"
step smoke 90 python3 -m tclock.cli train --env pointmass_reach --num-envs 256 --total-steps 65536 \
    --no-progress --out "$work/smoke" || exit 1
if wanted overhead; then
    for b in 256 4096; do
        step "overhead_$b" 220 python3 benchmarks/diagnostics_overhead.py --num-envs "$b" --iterations 40 --rounds 3
    done
fi
wanted sweep && step sweep 420 python3 -m tclock.cli sweep --no-progress --out "$work/sweep"
wanted accel && step accel 300 python3 benchmarks/accelerator.py --envs pointmass_reach halfcheetah \
    --batch-sizes 2048 16384 --mesh-sizes 1 --iterations 6
exit 0
