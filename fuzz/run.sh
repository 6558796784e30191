#!/usr/bin/env bash
# Runs the libFuzzer targets built by `make fuzz-build` (see README.md, "Fuzzing").
#   bash fuzz/run.sh BUILD_DIR SECONDS TARGET...
# For each target: replays fuzz/regressions/TARGET/* (inputs that once crashed), then fuzzes
# for SECONDS starting from fuzz/corpus/TARGET (the seeds) and BUILD_DIR/corpus/TARGET (what
# earlier runs found; kept between runs). A crash is saved as BUILD_DIR/crashes/TARGET/crash-*
# (or leak-, timeout-, oom-) and the log with its stack is BUILD_DIR/logs/TARGET.log.
# Exits 1 if any target crashed or any regression input still fails.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$1 secs=$2
shift 2
# Failing parsers leave what they held when fail() longjmps back: not leaks worth reporting.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
t_all=$(date +%s)
for t in "$@"; do
    bin=$build/fuzz_$t
    mkdir -p "$build/corpus/$t" "$build/crashes/$t" "$build/logs"
    log=$build/logs/$t.log
    if [ -d "fuzz/regressions/$t" ] && [ -n "$(ls -A "fuzz/regressions/$t" 2>/dev/null)" ]; then
        if "$bin" -close_fd_mask=2 -timeout=10 "fuzz/regressions/$t"/* > "$build/logs/$t.regressions.log" 2>&1; then
            echo "fuzz $t: $(ls "fuzz/regressions/$t" | wc -l) regression input(s) pass"
        else
            echo "fuzz $t: FAIL: a regression input in fuzz/regressions/$t still crashes; see $build/logs/$t.regressions.log:"
            grep -E "^(==[0-9]+==ERROR|SUMMARY|Running:|    #[0-9]+ )|runtime error" "$build/logs/$t.regressions.log" | head -20 | sed 's/^/    /'
            status=1
        fi
    fi
    t0=$(date +%s)
    "$bin" -max_total_time="$secs" -close_fd_mask=2 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/crashes/$t/" \
        "$build/corpus/$t" "fuzz/corpus/$t" > "$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    corp=$(ls "$build/corpus/$t" | wc -l)
    if [ $rc -eq 0 ]; then
        echo "fuzz $t: ok, ${runs:-?} runs in $(( $(date +%s) - t0 )) s, $corp inputs in $build/corpus/$t"
    else
        art=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
        echo "fuzz $t: FAIL (exit $rc) after ${runs:-?} runs; input: ${art:-none}; log: $log"
        grep -E "^(==[0-9]+==ERROR|SUMMARY)|runtime error|^    #[0-9]+ " "$log" | head -16 | sed 's/^/    /'
        status=1
    fi
done
echo "fuzz: $# target(s), $(( $(date +%s) - t_all )) s in all"
exit $status
