#!/usr/bin/env bash
# Mutation score of the fast tier: how many of the bugs mutmut plants in the modules that hold the project's rules
# make a fast test fail (a test not marked slow: no Ray cluster, no rehearsal). The figures and the surviving mutants
# judged equivalent are in docs/benchmarks.md ("Mutation score of the fast tier"). A documented command, not CI.
#
# Usage: bash scripts/mutation.sh [MODULE ...]   (default: every module of the table below; e.g. rules/checkpoints)
#
# Installs requirements/mutation.txt (mutmut, pinned) into .venv on first use. mutmut 3 copies the source into
# mutants/ and puts that copy first on sys.path. The tests import patches/, recipe/ and data/ as r1_ascend.patches,
# r1_ascend.recipe and r1_ascend.data (pyproject's package-dir), so each module is staged afresh in
# .mutation/<module>/ in that import layout (src/r1_ascend/ as r1_ascend/, patches/ as r1_ascend/patches/, ...): there, mutmut's copy is what the tests import.
# Each mutant runs the fast tests of its module's list that call the mutated function (mutmut records which test
# calls which function), one process at a time, under nice; test_rehearse_verdicts.py's own mutation checks (they
# exec edited copies of the verdicts, which mutmut's trampolines do not let them replace) are left out. Per module: .mutation/<module>/results.txt (every
# mutant and its status) and survivors.txt (the diff of every mutant no test killed).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
enter_checkout

python="$(cd "${venv}" && pwd)/bin/python"
work="${repo_root}/.mutation"

# module | source file | its fast tests (files; only tests not marked slow run) | the functions scored (regex; empty: all)
# (launch/pitfalls: the boundary tests alone, a lower bound; test_pitfalls.py runs the same rules through the
# preflight command, 2.5 s a test, and would take hours of mutants)
modules="
rules/checkpoints|patches/rules/checkpoints.py|tests/patches/test_verl_checkpoint_integrity.py tests/patches/test_checkpoint_rules.py|
rules/dp_layout|patches/rules/dp_layout.py|tests/patches/test_rules.py tests/patches/test_vllm_dp_ep_groups.py tests/patches/test_dp_layout_rules.py|
rules/expert_load|patches/rules/expert_load.py|tests/patches/test_verl_moe_expert_load.py tests/patches/test_expert_load_rules.py|
rules/group_routing|patches/rules/group_routing.py|tests/launch/test_group_routing.py tests/patches/test_verl_dpskv3_group_routing.py tests/patches/test_group_routing_rules.py|
rules/rollout_config|patches/rules/rollout_config.py|tests/patches/test_vllm_rollout_offload.py tests/patches/test_vllm_ascend_torchair_live_params.py tests/patches/test_rollout_config_rules.py|
rules/rollout_guard|patches/rules/rollout_guard.py|tests/patches/test_verl_rollout_guard.py tests/patches/test_rollout_guard_rules.py tests/patches/test_rollout_guard_calibration.py|
rules/model_config|patches/rules/model_config.py|tests/patches/test_verl_rollout_model_config.py|
rules/switches|patches/rules/switches.py|tests/patches/test_rules.py tests/patches/test_switch_rules.py|
rules/watchdog|patches/rules/watchdog.py|tests/patches/test_verl_worker_watchdog.py tests/patches/test_watchdog_rules.py|
launch/pitfalls|src/r1_ascend/launch/pitfalls.py|tests/launch/test_pitfall_boundaries.py|
rehearse/verdicts|src/r1_ascend/rehearse/verdicts.py|tests/launch/test_rehearse_verdicts.py tests/launch/test_rehearse_verdict_boundaries.py tests/launch/test_rehearse_faults.py tests/launch/test_model_summary.py tests/launch/test_judge_training.py|
rehearse/lifecycle|src/r1_ascend/rehearse/lifecycle.py|tests/launch/test_rehearse_verdicts.py tests/launch/test_rehearse_verdict_boundaries.py tests/launch/test_rehearse_faults.py tests/launch/test_loading_verdict.py tests/launch/test_sampling_verdict.py tests/launch/test_fault_verdicts.py|
rehearse/training|src/r1_ascend/rehearse/training.py|tests/launch/test_rehearse_training.py tests/launch/test_rehearse_training_boundaries.py|
rehearse/faults|src/r1_ascend/rehearse/faults.py|tests/launch/test_rehearse_faults.py tests/launch/test_fault_verdicts.py|plan_for|check_kept|check_refusal|require_complete|error_line|time_to_stop|running
rehearse/process_faults|src/r1_ascend/rehearse/process_faults.py|tests/launch/test_rehearse_faults.py tests/launch/test_fault_verdicts.py tests/launch/test_fault_hold.py|plan_for|stage_entered|with_descendants|raylet_of
recipe/watchdog|recipe/watchdog.py|tests/recipe/test_watchdog.py tests/recipe/test_watchdog_decisions.py|
weights/ckpt_root|src/r1_ascend/weights/ckpt_root.py|tests/weights/test_ckpt_root.py tests/weights/test_ckpt_root_boundaries.py|
launch/shared_dir|src/r1_ascend/launch/shared_dir.py|tests/launch/test_shared_dir.py|
launch/output_dir|src/r1_ascend/launch/output_dir.py|tests/launch/test_output_dir.py|
checkout|src/r1_ascend/checkout.py|tests/test_checkout.py|
recipe/reward_file|recipe/reward_file.py|tests/recipe/test_reward_file.py|
rules/weight_fingerprint|patches/rules/weight_fingerprint.py|tests/patches/test_weight_fingerprint_rules.py tests/patches/test_verl_weight_sync_check.py|
rules/mcore_mapping|patches/rules/mcore_mapping.py|tests/patches/test_mcore_mapping_rules.py tests/patches/test_verl_weight_sync_check.py tests/weights/test_megatron.py tests/weights/test_to_hf.py|
impl/weight_ownership|patches/impl/weight_ownership.py|tests/patches/test_weight_ownership.py tests/patches/test_weight_fingerprint_rules.py tests/patches/test_verl_weight_sync_check.py|
evaluate/metrics|src/r1_ascend/evaluate/metrics.py|tests/evaluate/test_metrics.py tests/evaluate/test_tables.py|
evaluate/scoring|src/r1_ascend/evaluate/scoring.py|tests/evaluate/test_scoring.py tests/evaluate/test_tables.py tests/report/test_evaluation.py|
evaluate/problems|src/r1_ascend/evaluate/problems.py|tests/evaluate/test_problems.py tests/evaluate/test_prompts.py tests/evaluate/test_scoring.py|
rehearse/moe_fault_run|src/r1_ascend/rehearse/moe_fault_run.py|tests/launch/test_rehearse_moe_faults.py|judge_moe_fault|bias_drift|judge_weight_check_stop|plan_for
report/compare|src/r1_ascend/report/compare.py|tests/report/test_compare.py tests/report/test_compare_stages.py tests/report/test_compare_boundaries.py|
"

installed="$("${python}" -m pip show mutmut 2>/dev/null || true)"
if ! grep -qx "Version: $(sed -n 's/^mutmut==//p' requirements/mutation.txt)" <<<"${installed}"; then
    echo "mutation: installing requirements/mutation.txt into ${venv}"
    "${python}" -m pip --disable-pip-version-check install -q -c requirements/cpu-constraints.txt \
        -r requirements/mutation.txt
fi

# stage DIR SOURCE TESTS...: the repository in its import layout, with mutmut's settings for SOURCE appended to
# pyproject.toml (only existing test files are listed, so a module's list may name tests still to be written).
stage() {
    local dir="$1" source="$2"
    shift 2
    local staged tests=()
    rm -rf "${dir}"
    mkdir -p "${dir}"
    cp -r src/r1_ascend "${dir}/r1_ascend"
    for package in patches recipe data; do
        cp -r "${package}" "${dir}/r1_ascend/${package}"
    done
    # the folders as well, unchanged, for tests that read them by path (recipe/config/*.yaml, ...); never src/: mutmut
    # puts mutants/src first on sys.path, and a copy there would be imported instead of the mutants
    cp -r patches recipe data tests docs scripts requirements benchmarks conftest.py pyproject.toml README.md \
        Dockerfile "${dir}/"
    find "${dir}" -name __pycache__ -prune -exec rm -rf {} +
    # mutmut runs pytest many times in one process: Hypothesis then sees a test class's method called from several
    # instances (differing_executors, harmless here); and a loaded machine must not turn a deadline or slow input
    # generation (too_slow) into a kill
    cat >>"${dir}/conftest.py" <<'PROFILE'


from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "mutation", deadline=None, suppress_health_check=[HealthCheck.differing_executors, HealthCheck.too_slow]
)
settings.load_profile("mutation")
PROFILE
    case "${source}" in
        patches/* | recipe/* | data/*) staged="r1_ascend/${source}" ;;
        src/*) staged="${source#src/}" ;;
        *) staged="${source}" ;;
    esac
    for test in "$@"; do
        [[ ! -f "${test}" ]] || tests+=("\"${test}\"")
    done
    local IFS=,
    cat >>"${dir}/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["r1_ascend"]
only_mutate = ["${staged}"]
also_copy = ["conftest.py", "patches", "recipe", "data", "docs", "scripts", "requirements", "benchmarks", "README.md",
    "Dockerfile"]
pytest_add_cli_args_test_selection = ["-m", "not slow", "-k", "not test_weakening_a_check_is_caught", ${tests[*]}]
EOF
}

# run_in_background_session DIR CMD...: CMD in DIR, in a session of its own whose scheduling group is niced where the
# kernel groups by session (sched_autogroup): there nice alone holds a process back only within its own session, and
# every Ray node of a rehearsal or test run starts sessions of its own, so a mutation run at nice 10 took a core
# from them. The script's INT and TERM stop the whole session.
session=""
run_in_background_session() {
    local dir="$1"
    shift
    # shellcheck disable=SC2016 # expanded by the session's shell
    setsid bash -c 'cd "$1" && shift && { [[ ! -w /proc/self/autogroup ]] || echo 19 >/proc/self/autogroup; } &&
        exec nice -n 10 "$@"' mutation "${dir}" "$@" &
    session=$!
    local status=0
    wait "${session}" || status=$?
    session=""
    return "${status}"
}
trap 'if [[ -n "${session}" ]]; then kill -TERM -- "-${session}" 2>/dev/null || true; fi; exit 130' INT TERM

# the chosen modules' table rows, in the order given (default: the whole table)
rows="${modules}"
if [[ $# -gt 0 ]]; then
    rows=""
    for wanted in "$@"; do
        row="$(grep "^${wanted}|" <<<"${modules}" || true)"
        [[ -n "${row}" ]] || { echo "mutation: unknown module ${wanted}; known: $(cut -d'|' -f1 <<<"${modules}" | xargs)" >&2; exit 2; }
        rows+="${row}"$'\n'
    done
fi
start=$(date +%s)
summary=()
while IFS='|' read -r name source tests scored; do
    [[ -n "${name}" ]] || continue
    dir="${work}/${name//\//-}"
    read -r -a test_files <<<"${tests}"
    echo "mutation: ${name} (${source}) against ${tests} (not slow), in ${dir}"
    stage "${dir}" "${source}" "${test_files[@]}"
    if ! run_in_background_session "${dir}" "${python}" -m mutmut run --max-children 1 >"${dir}/mutmut.log" 2>&1; then
        echo "mutation: mutmut failed on ${name}; see ${dir}/mutmut.log" >&2
        tail -n 20 "${dir}/mutmut.log" >&2
    fi
    (
        cd "${dir}"
        "${python}" -m mutmut results --all true >results.txt
        "${python}" - >survivors.txt <<'PY'
# the diff of every mutant no test detected (``mutmut show`` for each, in one process)
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant

for line in open("results.txt", encoding="utf-8"):
    name, _, status = line.strip().rpartition(": ")
    if name and status not in ("killed", "timeout"):
        print(f"# {name}: {status}")
        print(get_diff_for_mutant(name, path=find_mutant(name).path))
PY
    )
    summary+=("${name}|${dir}/results.txt|${scored}")
done <<<"${rows}"

"${python}" - "${summary[@]}" <<'PY'
import re
import sys
from collections import Counter

print(f"\n{'module':<24} {'killed':>7} {'survived':>9} {'no tests':>9} {'other':>6} {'total':>6} {'score':>7}")
for entry in sys.argv[1:]:
    name, results, scored = entry.split("|", 2)
    pattern = re.compile(rf"\.x[_ǁ](?:\w+?ǁ)?_*(?:{scored})") if scored else None
    counts: Counter[str] = Counter()
    for line in open(results, encoding="utf-8"):
        mutant, _, status = line.strip().rpartition(": ")
        if mutant and (pattern is None or pattern.search(mutant)):
            counts[status] += 1
    total = sum(counts.values())
    other = total - counts["killed"] - counts["survived"] - counts["no tests"]
    score = f"{100 * counts['killed'] / total:.1f} %" if total else "-"
    print(
        f"{name:<24} {counts['killed']:>7} {counts['survived']:>9} {counts['no tests']:>9} {other:>6} {total:>6} "
        f"{score:>7}"
    )
print("\nscore: killed / total, before excluding equivalent mutants (see docs/benchmarks.md)")
PY
echo "mutation: done in $(($(date +%s) - start)) s"
