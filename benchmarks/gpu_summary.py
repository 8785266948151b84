"""What the GPU check found, as `summary.json` and `summary.md`: the
versions and the GPU (`environment`, which runs this file with
`--versions` in a process of its own), every part's outcome, the tables
of `gpu.py`'s results and the issue's GPU targets. `gpu_check.py` uses it.
"""

import contextlib
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys

DISTRIBUTIONS = (
    "numpy",
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda12-plugin",
    "torch",
    "keras",
    "optree",
    "ml-dtypes",
    "h5py",
    "pytest",
    "pytest-xdist",
    "hypothesis",
)


def environment(env, backends):
    """Versions and devices (this file run with `--versions` in a process of
    its own) and what `nvidia-smi` says."""
    command = [sys.executable, __file__, "--versions", *backends]
    found, done = {}, None
    try:
        done = subprocess.run(
            command,
            # It runs beside the tests: JAX must not take the GPU's memory.
            env=dict(
                env,
                KERAS_BACKEND=backends[0],
                XLA_PYTHON_CLIENT_PREALLOCATE="false",
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as error:
        said = done.stderr[-2000:] if done is not None else ""
        found["error"] = f"{error!r} {said}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        found["nvidia_smi"] = "nvidia-smi: not found"
        return found
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    for key, arguments in (
        ("gpu", [f"--query-gpu={query}", "--format=csv"]),
        ("nvidia_smi", []),
    ):
        try:
            done = subprocess.run(
                [smi, *arguments], capture_output=True, text=True, timeout=30
            )
            found[key] = (done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            found[key] = "nvidia-smi: timed out"
    return found


def versions(backends):
    """Prints the versions and devices this Python sees as one JSON line
    (run with `--versions` in a process of its own: it imports the
    backends)."""
    found = {"python": platform.python_version(), "machine": platform.node()}
    for name in DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    errors = []
    if "jax" in backends:
        try:
            import jax

            devices = jax.devices()
            found["jax_devices"] = [
                f"{d.platform}: {d.device_kind}" for d in devices
            ]
            found["jax_gpu"] = any(d.platform == "gpu" for d in devices)
        except Exception as error:  # recorded, not raised
            errors.append(f"jax: {error!r}")
        found.update(jax_cuda_versions())
    if "torch" in backends:
        try:
            import torch

            found["torch_cuda"] = torch.version.cuda
            found["torch_cudnn"] = torch.backends.cudnn.version()
            found["torch_gpu"] = torch.cuda.is_available()
            if found["torch_gpu"]:
                found["torch_device"] = torch.cuda.get_device_name(0)
        except Exception as error:
            errors.append(f"torch: {error!r}")
    try:
        import keras

        import keras_attention

        found["keras_backend"] = keras.backend.backend()
        found["keras_attention"] = keras_attention.__version__
    except Exception as error:
        errors.append(f"keras: {error!r}")
    if errors:
        found["error"] = "; ".join(errors)
    print(json.dumps(found))


def jax_cuda_versions():
    """The CUDA runtime and cuDNN that JAX's plugin loaded, if any."""
    try:
        from jax._src.lib import cuda_versions

        return {
            "jax_cuda_runtime": cuda_versions.cuda_runtime_get_version(),
            "jax_cudnn": cuda_versions.cudnn_get_version(),
        }
    except Exception:  # no CUDA plugin, or a JAX without these names
        return {}


def write_summary(out, summary):
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(markdown(summary))


def markdown(summary):
    env = summary.get("environment", {})
    mode = "dry run on the CPU" if summary["dry_run"] else "GPU run"
    lines = [
        f"# GPU check, {mode}, {summary['started'][:19]}Z",
        "",
        f"{summary['seconds']} s in all; failed parts: "
        f"{', '.join(summary['failed_parts']) or 'none'}.",
        "",
        "| | |",
        "| --- | --- |",
    ]
    for key in (
        "gpu",
        "jax_devices",
        "torch_device",
        "jax_cuda_runtime",
        "jax_cudnn",
        "torch_cuda",
        "torch_cudnn",
        *DISTRIBUTIONS,
        "python",
        "error",
    ):
        if key in env:
            value = str(env[key]).replace("\n", "<br>")
            lines.append(f"| {key} | {value} |")
    lines += ["", "| part | ok | seconds | limit | detail |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for name, part in summary["parts"].items():
        detail = part.get("last_line") or part.get("log") or ""
        if part.get("timed_out"):
            detail = f"stopped at its limit; {detail}"
        lines.append(
            f"| {name} | {'yes' if part['ok'] else 'NO'} "
            f"| {part.get('seconds', '')} | {part.get('limit_s', '')} "
            f"| {detail} |"
        )
    for name, part in summary["parts"].items():
        if part.get("failures"):
            lines += ["", f"Failures in {name}:", ""]
            lines += [f"* `{failure}`" for failure in part["failures"]]
    for backend, bench in summary.get("bench", {}).items():
        lines += ["", *bench_tables(backend, bench)]
    lines += ["", *targets(summary.get("bench", {}))]
    lines += ["", "```", env.get("nvidia_smi", ""), "```", ""]
    return "\n".join(lines)


def bench_tables(backend, bench):
    rows = bench.get("rows", [])
    lines = [
        f"## {backend}: {bench.get('device')}, bfloat16, "
        f"{bench.get('tokens_per_batch')} tokens a batch",
        "",
        "| T | B | H | causal | path | TFLOP/s fwd: ours / raw (x) "
        "| fwd+bwd: ours / raw (x) | kernels: ours; raw |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if row["kind"] != "attention":
            continue
        lines.append(
            f"| {row['length']} | {row['batch']} | {row['head_dim']} "
            f"| {row['causal']} | {row['path']} "
            f"| {row['ours_fwd_tflops']:.1f} / {row['raw_fwd_tflops']:.1f} "
            f"({row['fwd_ours_over_raw']:.2f}) "
            f"| {row['ours_fwdbwd_tflops']:.1f} / "
            f"{row['raw_fwdbwd_tflops']:.1f} "
            f"({row['fwdbwd_ours_over_raw']:.2f}) "
            f"| {', '.join(row['ours_fwdbwd_kernels'])}; "
            f"{', '.join(row['raw_fwdbwd_kernels'])} |"
        )
    lines += ["", "| layer step: T | B | H | causal | ms | TFLOP/s |"]
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        if row["kind"] == "layer":
            lines.append(
                f"| {row['length']} | {row['batch']} | {row['head_dim']} "
                f"| {row['causal']} | {row['step_ms']:.2f} "
                f"| {row['tflops']:.1f} |"
            )
    lines += mods_table(rows)
    for row in rows:
        if row["kind"] == "generation":
            lines.append(
                f"\nGeneration, batch {row['batch']}: "
                f"{row['tokens_per_s']:.0f} tokens/s"
            )
    for key in ("skipped", "failed"):
        if bench.get(key):
            lines += ["", f"{key}: {'; '.join(bench[key])}"]
    return lines


def mods_table(rows):
    """The `mods` rows: forward and backward ms of each candidate, the
    dispatched path's speed-up over each, FlexAttention's difference."""
    rows = [row for row in rows if row["kind"] == "mods"]
    if not rows:
        return []
    lines = [
        "",
        "| mask mod: pattern | T | B | path | mod ms | dense ms | flex ms "
        "(first call s) | mod over dense | mod over flex | flex difference |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        flex, over_flex, difference = "-", "-", "-"
        if "flex_fwdbwd_ms" in row:
            flex = (
                f"{row['flex_fwdbwd_ms']:.2f} ({row['flex_first_call_s']:.0f})"
            )
            over_flex = f"{row['mod_over_flex']:.2f}x"
            difference = f"{row['flex_largest_difference']:.2g}"
        elif "flex" in row:
            flex = row["flex"]
        lines.append(
            f"| {row['pattern']} | {row['length']} | {row['batch']} "
            f"| {row['path']} | {row['mod_fwdbwd_ms']:.2f} "
            f"| {row['dense_fwdbwd_ms']:.2f} | {flex} "
            f"| {row['mod_over_dense']:.2f}x | {over_flex} | {difference} |"
        )
    return lines


def targets(benches):
    """The issue's GPU targets at T = 4096 in bfloat16: ours >= 0.9x the
    raw op's TFLOP/s, and >= 400 TFLOP/s forward with head dim 128, not
    causal."""
    lines = ["## Targets at T = 4096, bfloat16", ""]
    for backend, bench in benches.items():
        rows = [
            row
            for row in bench.get("rows", [])
            if row["kind"] == "attention" and row["length"] == 4096
        ]
        if not rows:
            lines.append(f"* {backend}: not measured at T = 4096")
            continue
        worst = min(
            min(row["fwd_ours_over_raw"], row["fwdbwd_ours_over_raw"])
            for row in rows
        )
        lines.append(
            f"* {backend}: ours / raw at least {worst:.2f} "
            f"({'met' if worst >= 0.9 else 'NOT met'}: >= 0.9)"
        )
        for row in rows:
            if row["head_dim"] == 128 and not row["causal"]:
                value = row["ours_fwd_tflops"]
                lines.append(
                    f"* {backend}: forward, head dim 128, not causal: "
                    f"{value:.0f} TFLOP/s "
                    f"({'met' if value >= 400 else 'NOT met'}: >= 400)"
                )
    return lines


if __name__ == "__main__" and sys.argv[1:2] == ["--versions"]:
    versions(sys.argv[2:])
