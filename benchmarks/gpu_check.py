"""The GPU check: the GPU tests and `gpu.py` on JAX and PyTorch, one call.

On a machine with an NVIDIA GPU, JAX and PyTorch built for CUDA, pytest,
pytest-xdist and hypothesis, but no Keras and no network, with the wheels
of Keras and of the two dependencies that machine lacks in `.whl` (here,
`make gpu-wheels` downloads them):

    python3 benchmarks/gpu_check.py         # or: make gpu-check

installs `.whl/*.whl` in a temporary folder and records the versions and
`nvidia-smi`; runs the GPU tests (`TESTS`: the fused path against the
float64 reference in float32, float16 and bfloat16, forward and
gradients, with padding, causal masks, rows that see no key, windows,
segment ids and the cached decoding step) on JAX and then on PyTorch;
then `gpu.py` on each, sharing what is left of the budget. Each part
runs in its own processes under its own time limit (`LIMITS`); one that
fails or runs out of time does not stop the next, and the whole run ends
within `--budget-s` (9 minutes). It writes under
`$OUT` if set, else `build/gpu-check`, eight files at most:

    summary.json, summary.md   versions, GPU, every part's outcome, the
                               benchmark tables, the issue's GPU targets
    tests_<backend>.log        pytest's output
    bench_<backend>.log        gpu.py's output
    gpu_<backend>.json         gpu.py's results (for benchmarks/results/)

and exits with 1 if any part failed. `--dry-run` runs the same on the CPU
(`tests/integration/test_gpu_check.py` does, in the suite): the same
selection of tests, narrowed by `DRY_RUN_TESTS` to a few cases, and
`gpu.py --quick`, with TensorFlow and keras-hub hidden, as they are
absent there.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from gpu_summary import environment
from gpu_summary import write_summary

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("jax", "torch")

# Test files and tests that run the fused path (which a GPU backend sends
# to its kernel) or the automatic choice, against the float64 reference.
TESTS = (
    "tests/unit/kernels/test_paths.py",
    "tests/unit/kernels/test_fused_kernel_shapes.py",
    "tests/unit/core/test_structure.py::"
    "test_every_path_equals_the_numpy_reference",
    "tests/unit/core/test_structure.py::"
    "test_hidden_keys_get_exactly_zero_gradient",
    "tests/unit/core/test_structure.py::"
    "test_bottom_right_is_top_left_shifted_by_the_cache",
    "tests/unit/core/test_structure.py::test_mixed_dtypes_with_alibi_and_masks",
    "tests/unit/functional/test_functional.py::"
    "test_fully_masked_rows_give_zeros_not_nan",
    "tests/unit/functional/test_functional.py::"
    "test_gradients_finite_with_fully_masked_rows",
    "tests/unit/functional/test_functional.py::"
    "test_half_precision_matches_float32",
    "tests/unit/functional/test_functional.py::"
    "test_half_precision_large_logits_stay_finite",
    "tests/unit/functional/test_functional.py::"
    "test_fused_dispatch_equals_reference",
    "tests/unit/functional/test_functional.py::"
    "test_padded_keys_and_values_do_not_change_output",
    "tests/unit/functional/test_properties.py::"
    "test_scaled_dot_product_attention_properties",
    "tests/unit/kernels/test_mod_paths.py::"
    "test_mask_mod_paths_equal_float64_reference",
    "tests/unit/kernels/test_mod_paths.py::"
    "test_mask_mods_combine_with_the_structure_arguments",
    # With a GPU, FlexAttention is a path of these tests (uncompiled; the
    # compiled kernel is compared in gpu.py's `mods` rows).
    "tests/unit/kernels/test_mod_paths.py::"
    "test_relative_position_bias_and_its_table_gradients",
    "tests/unit/kernels/test_mod_paths.py::"
    "test_score_mod_variables_get_gradients_on_every_path",
    "tests/unit/kernels/test_mod_paths.py::"
    "test_hidden_keys_get_exactly_zero_gradients",
    "tests/unit/kernels/test_mod_paths.py::"
    "test_flex_outputs_equal_float64_reference",
    "tests/contract/test_paths_layers.py",
    "tests/unit/layers/test_multi_head_attention.py::"
    "test_cached_decoding_equals_full_causal_forward",
    "tests/unit/layers/test_multi_head_attention.py::"
    "test_cached_decoding_with_padding_and_scores",
    "tests/unit/layers/test_transformer_blocks.py::"
    "test_cached_decoding_equals_full_forward",
    "tests/unit/layers/test_rolling_cache.py::"
    "test_rolling_decoding_equals_the_full_pass",
)
# The path harness's RNN mechanisms have no fused path.
NOT_ATTENTION = (
    "not (Bahdanau or Luong or AttentionDecoder or LocationSensitive "
    "or Monotonic)"
)
# What a dry run keeps of TESTS: the fused path at a kernel's shapes in a
# cached step, and every path of one masked case.
DRY_RUN_TESTS = (
    "(kernel_shapes and cached) "
    "or (test_sdpa_paths_equal_float64_reference and gqa-padding+causal)"
)
# Seconds each part may take at most. The tests of both backends run
# first; the benchmarks share what is left of the budget.
LIMITS = {"tests": 170, "bench": 200}
SUMMARY_S = 10  # kept for writing the summary
# gpu.py stops starting jobs this long before its part's limit: a job
# started then still ends in time.
BENCH_RESERVE_S = 25
# pytest -v's words for the outcomes, and the summary's.
OUTCOMES = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "errors",
    "SKIPPED": "skipped",
}
# The GPU machine has neither; a dry run hides them (Keras also imports
# TensorFlow, if it finds it, to seed its generator).
ABSENT = ("tensorflow", "keras_hub")
GPU_WORKERS = 12  # pytest-xdist workers on the GPU machine's 16 cores


def main():
    args = parse_args()
    start = time.monotonic()
    out = Path(args.out or os.environ.get("OUT") or ROOT / "build/gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "dry_run": args.dry_run,
        "backends": args.backends,
        "budget_s": args.budget_s,
        "selection": {"tests": list(TESTS), "k": selection_expression(args)},
        "parts": {},
    }

    def save():
        """Writes the summary so far: a run stopped from outside keeps
        it."""
        summary["seconds"] = round(time.monotonic() - start, 1)
        summary["failed_parts"] = [
            name for name, part in summary["parts"].items() if not part["ok"]
        ]
        write_summary(out, summary)

    try:
        run_check(args, out, summary, start + args.budget_s, save)
    finally:
        save()
    failed = summary["failed_parts"]
    print(f"GPU check: {len(failed)} parts failed {failed}; see {out}")
    return 1 if failed else 0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="on the CPU: a few of the tests, gpu.py --quick",
    )
    parser.add_argument(
        "--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS)
    )
    parser.add_argument("--out", help="the folder to write (default: $OUT)")
    parser.add_argument("--wheels", default=str(ROOT / ".whl"))
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"pytest-xdist workers (default: {GPU_WORKERS}, 0 dry)",
    )
    args = parser.parse_args()
    if args.workers is None:
        args.workers = 0 if args.dry_run else GPU_WORKERS
    return args


def run_check(args, out, summary, deadline, save):
    site = tempfile.mkdtemp(prefix="gpu-check-site-")
    if args.dry_run:  # the wheels are for the GPU machine's Python
        summary["parts"]["install"] = {"ok": True, "detail": "dry run: none"}
        hide_packages(site, ABSENT)
    else:
        summary["parts"]["install"] = install_wheels(Path(args.wheels), site)
    paths = [site, str(ROOT), os.environ.get("PYTHONPATH", "")]
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    base["PYTHONUNBUFFERED"] = "1"
    base["TF_CPP_MIN_LOG_LEVEL"] = "3"
    # Read while the tests run: it imports the backends too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(environment, base, args.backends)
        run_tests(args, out, summary, base, site, deadline, save)
        found = summary["environment"] = reading.result()
    summary["parts"]["versions"] = {"ok": "error" not in found}
    if not args.dry_run:  # JAX falls back to the CPU without a word
        blind = [b for b in args.backends if not found.get(f"{b}_gpu")]
        summary["parts"]["gpu"] = {
            "ok": not blind,
            "last_line": f"no GPU seen by {blind}" if blind else "seen",
        }
    save()
    run_benchmarks(args, out, summary, base, deadline, save)


def run_tests(args, out, summary, base, site, deadline, save):
    for backend in args.backends:
        log = out / f"tests_{backend}.log"
        junit = Path(site).with_name(f"{Path(site).name}-{backend}.xml")
        part = run_part(
            pytest_command(args, junit),
            pytest_environment(dict(base, KERAS_BACKEND=backend)),
            log,
            part_limit(LIMITS["tests"], deadline),
        )
        part.update(pytest_results(log, junit))
        summary["parts"][f"tests {backend}"] = part
        save()


def run_benchmarks(args, out, summary, base, deadline, save):
    for i, backend in enumerate(args.backends):
        # The benchmarks share what the tests left of the budget.
        left = len(args.backends) - i
        share = (deadline - time.monotonic() - SUMMARY_S) / left
        limit = part_limit(min(LIMITS["bench"], share), deadline)
        log = out / f"bench_{backend}.log"
        results = out / f"gpu_{backend}.json"
        command = [sys.executable, "gpu.py", "--output", str(results)]
        command += ["--budget-s", str(max(limit - BENCH_RESERVE_S, 1))]
        command += ["--quick"] if args.dry_run else []
        env = dict(base, KERAS_BACKEND=backend)
        part = run_part(command, env, log, limit, cwd=ROOT / "benchmarks")
        summary["parts"][f"bench {backend}"] = part
        if results.exists():
            summary.setdefault("bench", {})[backend] = json.loads(
                results.read_text()
            )
        save()


def part_limit(limit, deadline):
    """`limit`, or what is left of the run's budget less the time for the
    summary."""
    return int(max(1, min(limit, deadline - time.monotonic() - SUMMARY_S)))


def hide_packages(site, names):
    """Packages in `site` that raise ImportError, hiding the installed
    ones of these names from the processes that have `site` first on
    their path."""
    for name in names:
        package = Path(site) / name
        package.mkdir()
        (package / "__init__.py").write_text(
            f"raise ImportError('{name} is not on the GPU machine')\n"
        )


def install_wheels(wheels, site):
    """pip-installs every wheel in `wheels` into `site`."""
    found = sorted(glob.glob(str(wheels / "*.whl")))
    if not found:
        return {"ok": True, "detail": f"no wheels in {wheels}; none installed"}
    command = [sys.executable, "-m", "pip", "install", "--quiet"]
    command += ["--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    command += ["--upgrade", "--target", site, *found]
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False
    )
    return {
        "ok": done.returncode == 0,
        "seconds": round(time.monotonic() - start, 1),
        "wheels": [Path(w).name for w in found],
        "detail": (done.stdout + done.stderr)[-2000:],
    }


def selection_expression(args):
    if args.dry_run:
        return f"({NOT_ATTENTION}) and ({DRY_RUN_TESTS})"
    return NOT_ATTENTION


def pytest_command(args, junit):
    command = [sys.executable, "-m", "pytest", *TESTS]
    command += ["-k", selection_expression(args), "-p", "no:cacheprovider"]
    # -v: a part stopped at its limit still shows what ran and how.
    command += ["-v", "-rfE", "--durations=15", f"--junitxml={junit}"]
    # A warning a newer library raises on the GPU machine is reported,
    # not turned into a failure that would hide the test's numbers.
    command += ["-W", "default::Warning", "-W", "ignore::DeprecationWarning"]
    command += ["-W", "ignore::PendingDeprecationWarning"]
    if args.workers:
        command += ["-n", str(args.workers), "--dist", "load"]
    return command


def pytest_environment(env):
    """The tests' settings on the GPU. JAX takes memory as it needs it
    (several test processes share the GPU) and multiplies float32
    matrices in float32, not TensorFlow32 (the tests compare float32 with
    a float64 reference at 2e-5); compiling without autotuning keeps the
    tests' many small programs quick and computes the same."""
    flags = env.get("XLA_FLAGS", "").split()
    flags.append("--xla_gpu_autotune_level=0")
    return dict(
        env,
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        JAX_DEFAULT_MATMUL_PRECISION="highest",
        XLA_FLAGS=" ".join(flags),
    )


def run_part(command, env, log, limit, cwd=ROOT):
    """Runs `command` in a process group of its own, its output in `log`,
    killed with its children after `limit` seconds."""
    start = time.monotonic()
    with open(log, "w") as stream:
        stream.write(f"$ {shlex.join(command)}\n")
        stream.flush()
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        with_children(process, signal.SIGKILL)
        process.wait()
        seconds = round(time.monotonic() - start, 1)
        if code is None:
            stream.write(f"\n### stopped after its limit of {limit} s\n")
    return {
        "ok": code == 0,
        "returncode": code,
        "timed_out": code is None,
        "seconds": seconds,
        "limit_s": limit,
        "log": log.name,
    }


def with_children(process, sig):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def pytest_results(log, junit):
    """Counts and failures from pytest's JUnit XML (then removed) or, if
    it was stopped before writing one, from its log; and the log's last
    line."""
    lines = log.read_text(errors="replace").strip().splitlines()
    if junit.exists():
        found = junit_outcomes(junit)
        junit.unlink()
    else:
        found = logged_outcomes(lines)
    last = lines[-1] if lines else ""
    for word in ("deselected", "warnings"):
        match = re.search(rf"(\d+) {word}", last)
        found[word] = int(match.group(1)) if match else 0
    found["last_line"] = last
    return found


def junit_outcomes(junit):
    found = dict.fromkeys(OUTCOMES.values(), 0)
    failures = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = {child.tag: child for child in case}
        bad = tags.get("failure", tags.get("error"))
        if "skipped" in tags:
            found["skipped"] += 1
        elif bad is None:
            found["passed"] += 1
        else:
            found["failed" if "failure" in tags else "errors"] += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            failures.append(f"{name}: {bad.get('message', '')}"[:400])
    return dict(found, failures=failures[:40])


def logged_outcomes(lines):
    """The outcomes `pytest -v` printed, one line a test."""
    found = dict.fromkeys(OUTCOMES.values(), 0)
    failures = []
    for line in lines:
        words = set(line.split())
        for outcome, key in OUTCOMES.items():
            if outcome in words and "::" in line:
                found[key] += 1
                if key in ("failed", "errors"):
                    failures.append(line[:400])
    return dict(found, failures=failures[:40])


if __name__ == "__main__":
    sys.exit(main())
