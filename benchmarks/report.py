"""Writes docs/performance.md and its plots from benchmarks/results/*.json.

python benchmarks/report.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from keras_attention.visualization import save_figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
FIGURES = DOCS / "assets" / "performance"
BACKENDS = ("tensorflow", "jax", "torch")
INTRO = (Path(__file__).parent / "performance_intro.md").read_text()
# The context-parallel tables, included in the long-sequences guide.
SNIPPET = RESULTS / "context_parallel.md"


def load(name):
    results = {}
    for backend in BACKENDS:
        path = RESULTS / f"{name}_{backend}.json"
        if path.exists():
            results[backend] = json.loads(path.read_text())
    return results


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def layers_section(plot=True):
    results = load("layers")
    lines = [
        "## Training step and forward pass",
        "",
        "Milliseconds (median), B=8, D=512, 8 heads, float32, no mask. "
        "*speed-up* is the other layer's time over ours (above 1: ours is "
        "faster); *% matmul* is the achieved fraction of the machine's "
        "matmul throughput measured in the same run.",
        "",
    ]
    for backend, data in results.items():
        rows = {(r["name"], r["T"]): r for r in data["rows"]}
        lengths = sorted({r["T"] for r in data["rows"]})
        lines += [
            f"### {backend} (matmul {data['matmul_gflops']:.0f} GFLOP/s)",
            "",
            "| T | ours train | keras MHA train | speed-up | ours forward "
            "| keras MHA forward | speed-up | ours % matmul (train) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for t in lengths:
            ours, keras_mha = rows[("ours", t)], rows[("keras_mha", t)]
            lines.append(
                f"| {t} | {ours['train_ms']:.1f} | {keras_mha['train_ms']:.1f} "
                f"| {ratio(keras_mha['train_ms'], ours['train_ms'])} "
                f"| {ours['forward_ms']:.1f} | {keras_mha['forward_ms']:.1f} "
                f"| {ratio(keras_mha['forward_ms'], ours['forward_ms'])} "
                f"| {100 * ours['train_fraction_of_matmul']:.0f}% |"
            )
        lines += [
            "",
            "| T | our encoder block train | keras-hub TransformerEncoder "
            "train | speed-up | forward | keras-hub forward | speed-up |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for t in lengths:
            ours, hub = rows[("ours_block", t)], rows[("keras_hub_block", t)]
            lines.append(
                f"| {t} | {ours['train_ms']:.1f} | {hub['train_ms']:.1f} "
                f"| {ratio(hub['train_ms'], ours['train_ms'])} "
                f"| {ours['forward_ms']:.1f} | {hub['forward_ms']:.1f} "
                f"| {ratio(hub['forward_ms'], ours['forward_ms'])} |"
            )
        if ("torch_mha", lengths[0]) in rows:
            lines += [
                "",
                "| T | torch.nn.MultiheadAttention train | time ours / torch "
                "| torch MHA forward (eval fast path) | time ours / torch "
                "| raw SDPA kernel alone, train / forward |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for t in lengths:
                ours, mha = rows[("ours", t)], rows[("torch_mha", t)]
                sdpa = rows[("torch_sdpa_kernel", t)]
                lines.append(
                    f"| {t} | {mha['train_ms']:.1f} "
                    f"| {ratio(ours['train_ms'], mha['train_ms'])} "
                    f"| {mha['forward_ms']:.1f} "
                    f"| {ratio(ours['forward_ms'], mha['forward_ms'])} "
                    f"| {sdpa['train_ms']:.1f} / {sdpa['forward_ms']:.1f} |"
                )
        lines.append("")
    if plot:
        plot_layers(results)
    lines += ["![Training step speed-up](assets/performance/layers.png)", ""]
    return lines


def plot_layers(results):
    figure, ax = plt.subplots(figsize=(6, 3.5))
    for backend, data in results.items():
        rows = {(r["name"], r["T"]): r for r in data["rows"]}
        lengths = sorted({r["T"] for r in data["rows"]})
        speedups = [
            rows[("keras_mha", t)]["train_ms"] / rows[("ours", t)]["train_ms"]
            for t in lengths
        ]
        ax.plot(lengths, speedups, marker="o", label=backend)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("keras MHA time / ours")
    ax.set_title("MultiHeadSelfAttention training step vs keras MHA")
    ax.legend()
    figure.tight_layout()
    FIGURES.mkdir(parents=True, exist_ok=True)
    save_figure(figure, FIGURES / "layers.png", dpi=120)
    plt.close(figure)


def paths_section():
    results = load("paths")
    lines = [
        "## Choosing a path",
        "",
        "Where no fused kernel runs, the reference and the blockwise path, "
        "each forced, and the path the dispatch picks (*auto*), forward "
        "and backward of attention alone (B=8, 8 heads of 64, float32, "
        "milliseconds, median). *cost* is the blockwise path's time over "
        "the reference's per block pair it visits, the factor the "
        "dispatch's cost model uses; *matmul efficiency* is the time the "
        "same block-shaped matmuls take alone in the same process over "
        "the blockwise kernel's time, in the blocks it takes (*block*, "
        "rows). *auto path* is the path "
        "`explain()` names; `chunked` is the blockwise path.",
        "",
        "| backend | T | causal | block | reference | blockwise | auto "
        "| auto path | cost | matmul efficiency |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        for r in data["rows"]:
            lines.append(
                f"| {backend} | {r['T']} | {'yes' if r['causal'] else 'no'} "
                f"| {r.get('block', 256)} | {r['reference_ms']:.0f} "
                f"| {r['chunked_ms']:.0f} "
                f"| {r['auto_ms']:.0f} | {r['auto_path']} | {r['cost']:.2f} "
                f"| {r['matmul_efficiency']:.2f} |"
            )
    lines.append("")
    for backend, data in results.items():
        lines.append(
            f"* {backend}: median cost {data['fitted_cost']:.2f} per block "
            f"pair; the dispatch uses {data['dispatch_cost']}."
        )
    return [*lines, ""]


def memory_section():
    results = load("memory")
    lines = [
        "## Peak memory of a training step",
        "",
        "MiB above the memory held before the step (two steps, compilation "
        "included), B=8, D=512, 8 heads. *not run* marks a length whose "
        "predicted peak (4x the previous length's) exceeds the "
        "budget given; *ratio* is ours over keras MHA. Without a mask, "
        "ours takes the reference path on TensorFlow while its weights "
        "fit in 1 GiB (see *How the kernels are chosen*).",
        "",
        "| backend | T | ours | keras MHA | ratio | ours, causal "
        "| keras MHA, causal | ratio, causal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell(row):
        if row.get("peak_mib") is not None:
            return f"{row['peak_mib']:.0f}"
        if "predicted_gib" in row:
            return f"not run (over ~{row['predicted_gib']:.0f} GiB)"
        return "failed"

    for backend, data in results.items():
        rows = {(r["name"], r["T"]): r for r in data["rows"]}
        for t in sorted({r["T"] for r in data["rows"]}):
            ours, keras_mha = rows[("ours", t)], rows[("keras_mha", t)]
            causal = [
                rows.get((name, t), {})
                for name in ("ours_causal", "keras_mha_causal")
            ]
            peaks = [row.get("peak_mib") for row in (ours, keras_mha, *causal)]
            lines.append(
                f"| {backend} | {t} | {cell(ours)} | {cell(keras_mha)} "
                f"| {ratio(peaks[0], peaks[1])} "
                f"| {cell(causal[0]) if causal[0] else '-'} "
                f"| {cell(causal[1]) if causal[1] else '-'} "
                f"| {ratio(peaks[2], peaks[3])} |"
            )
    return [*lines, ""]


def causal_section():
    results = load("causal")
    lines = [
        "## Causal attention",
        "",
        "Milliseconds (median), B=4, D=512, 8 heads, float32. Training "
        "steps of `MultiHeadSelfAttention` with `use_causal_mask=True` "
        "(*ours causal*) and without (*ours full*), and of "
        "`keras.layers.MultiHeadAttention(use_causal_mask=True)`; then the "
        "attention kernel alone, forward and backward, against PyTorch's "
        "`scaled_dot_product_attention(is_causal=True)` in the same "
        "process. *vs keras* and *causal vs full* are speed-ups (above 1: "
        "ours causal is faster); *vs torch* is our kernel's time over "
        "PyTorch's.",
        "",
        "| backend | T | ours causal | ours full | keras MHA causal "
        "| vs keras | causal vs full | our kernel | torch kernel "
        "| vs torch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        rows = {(r["name"], r["T"]): r["train_ms"] for r in data["rows"]}
        for t in sorted({r["T"] for r in data["rows"]}):
            ours, full = rows[("ours_causal", t)], rows[("ours_full", t)]
            keras_mha = rows[("keras_mha_causal", t)]
            kernel = rows[("ours_kernel_causal", t)]
            torch_kernel = rows[("torch_sdpa_kernel_causal", t)]
            lines.append(
                f"| {backend} | {t} | {ours:.0f} | {full:.0f} "
                f"| {keras_mha:.0f} | {ratio(keras_mha, ours)} "
                f"| {ratio(full, ours)} | {kernel:.0f} | {torch_kernel:.0f} "
                f"| {ratio(kernel, torch_kernel)} |"
            )
    lines += [
        "",
        "The blockwise kernel is made of batched matmuls of a 256-row block "
        "against 256 keys at head dim 64. How fast the backend's compiled "
        "matmul runs those shapes (GFLOP/s, PyTorch's on the same shapes in "
        "the same process) bounds what the kernel can reach:",
        "",
        "| backend | square 2048 | logits block (32x256x64 @ 64x256) "
        "| values block (32x256x256 @ 256x64) |",
        "| --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        cells = {
            r["name"]: f"{r['gflops']:.0f} (PyTorch {r['torch_gflops']:.0f})"
            for r in data.get("matmul_profile", [])
        }
        if cells:
            lines.append(
                f"| {backend} | {cells['matmul_square']} "
                f"| {cells['matmul_logits_block']} "
                f"| {cells['matmul_values_block']} |"
            )
    return [*lines, *causal_breakdown(results), ""]


# The causal training step's time against keras MHA's that issue-level
# targets ask for, per backend (time ratios: ours / keras).
CAUSAL_TARGETS = {"tensorflow": 0.77, "jax": 0.40, "torch": 1.0}


def causal_breakdown(results):
    """Where the causal training step's time goes, from the same run:
    the kernel measured alone, the block matmuls it is made of at the
    measured rate of their shapes, and what the kernel would have to take
    for the step to meet its target against keras MHA."""
    lines = [
        "",
        "Where the causal training step's time goes, in the same run "
        "(milliseconds): *kernel* is the attention kernel alone, forward "
        "and backward (as above); *rest* is the step without it "
        "(projections, loss, optimizer, Keras's step); *block matmuls* is "
        "the time the kernel's 7 matmuls per block pair take at the rates "
        "measured above for their shapes, and *other kernel work* the "
        "remainder of the kernel (the softmax's elementwise work, masking, "
        "loop control). *kernel for target* is the kernel time at which "
        "the step would reach the target time ratio against keras MHA "
        "(0.77 on TensorFlow and 0.40 on JAX at T >= 2048, 1.0 "
        "elsewhere); on PyTorch the kernel is the fused one, not made of "
        "block matmuls.",
        "",
        "| backend | T | step | kernel | rest | block matmuls "
        "| other kernel work | target | kernel for target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        rates = {r["name"]: r["gflops"] for r in data.get("matmul_profile", [])}
        if not rates:
            continue
        rows = {(r["name"], r["T"]): r["train_ms"] for r in data["rows"]}
        block = 256
        heads = data["B"] * data["N"]
        pair_flops = 2 * block * block * (data["D"] // data["N"]) * heads
        pair_ms = (
            1e3
            * pair_flops
            * (
                3 / (rates["matmul_logits_block"] * 1e9)
                + 4 / (rates["matmul_values_block"] * 1e9)
            )
        )
        for t in sorted({r["T"] for r in data["rows"]}):
            step, kernel = (
                rows[("ours_causal", t)],
                rows[("ours_kernel_causal", t)],
            )
            keras_mha = rows[("keras_mha_causal", t)]
            blocks = -(-t // block)
            matmuls = blocks * (blocks + 1) // 2 * pair_ms
            target = CAUSAL_TARGETS[backend] if t >= 2048 else 1.0
            needed = target * keras_mha - (step - kernel)
            # PyTorch's fused kernel is not made of these block matmuls.
            fused = backend == "torch"
            lines.append(
                f"| {backend} | {t} | {step:.0f} | {kernel:.0f} "
                f"| {step - kernel:.0f} "
                f"| {'-' if fused else f'{matmuls:.0f}'} "
                f"| {'-' if fused else f'{kernel - matmuls:.0f}'} "
                f"| {target:.2f} | {needed:.0f} ({needed / kernel:.2f}x) |"
            )
    return lines


def kernel_forms_section():
    results = load("kernel_forms")
    if not results:
        return []
    data = next(iter(results.values()))
    rows = {
        (backend, r["experiment"], r["name"], r["options"]): r["ms"]
        for backend, result in results.items()
        for r in result["rows"]
    }

    def cell(key, base_key):
        """`ms (speed against the kernel's own form)`, or `-`."""
        if key not in rows:
            return "-"
        return f"{rows[key]:.1f} ({ratio(rows[base_key], rows[key])})"

    lines = [
        "## Forms of the blockwise kernel",
        "",
        "The blockwise kernel written and compiled in other ways, each "
        "against the kernel's own form in the same run "
        f"(B={data['B']}, {data['N']} heads of {data['H']}, float32, "
        f"blocks of {data['block']}; the whole kernel forward and backward "
        f"at T={data['T']}). Milliseconds, and in brackets the speed "
        "against the kernel's own form (above 1: faster). First, on JAX, "
        "the block matmuls written as `matmul` with the keys' axes "
        "swapped (the kernel's form), as one `einsum` (`dot_general`), "
        "with the heads as their own axis, and with the keys stored "
        "transposed:",
        "",
        "| form | logits block | values block | key gradient block |",
        "| --- | --- | --- | --- |",
    ]
    families = {
        "logits": "logits_matmul_swapaxes",
        "values": "values_matmul",
        "key_grad": "key_grad_matmul_swapaxes",
    }
    forms = {
        "the kernel's": ("matmul_swapaxes", "matmul", "matmul_swapaxes"),
        "einsum": ("einsum",) * 3,
        "heads as an axis": ("heads_axis",) * 3,
        "keys transposed": ("keys_transposed", None, None),
    }
    for label, names in forms.items():
        pairs = zip(families.items(), names, strict=True)
        cells = [
            cell(("jax", "matmul form", f"{family}_{name}", "default"),
                 ("jax", "matmul form", base, "default"))
            if name else "-"
            for (family, base), name in pairs
        ]  # fmt: skip
        lines.append(f"| {label} | {' | '.join(cells)} |")
    options = {
        "default": "none (the kernel's)",
        "onednn": "oneDNN matmuls",
        "ynn_dot": "YNNPACK fusion: dots",
        "ynn_dot_eltwise": "YNNPACK fusion: dots, elementwise",
        "xnn_dot": "XNNPACK fusion: dots",
        "onednn_dot": "oneDNN fusion: dots",
        "fast_math": "fast math",
    }
    kernel = f"kernel T={data['T']} causal"
    lines += [
        "",
        "XLA:CPU's per-function compiler options on JAX "
        "(`jax.jit(f).lower(...).compile(compiler_options=...)`), on one "
        "block matmul and on the whole causal kernel:",
        "",
        "| option | logits block | values block | causal kernel |",
        "| --- | --- | --- | --- |",
    ]
    for option, label in options.items():
        cells = [
            cell(("jax", "compiler options", name, option),
                 ("jax", "compiler options", name, "default"))
            for name in ("logits_matmul_swapaxes", "values_matmul", kernel)
        ]  # fmt: skip
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += [
        "",
        "Block sizes, the whole kernel:",
        "",
        "| backend | attention | blocks of 128 | blocks of 256 "
        "| blocks of 512 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for backend in results:
        for causal in (False, True):
            name = f"kernel T={data['T']} causal={causal}"
            base = (backend, "block size", name, "blocks of 256")
            cells = [
                cell((backend, "block size", name, f"blocks of {c}"), base)
                for c in (128, 256, 512)
            ]
            lines.append(
                f"| {backend} | {'causal' if causal else 'full'} "
                f"| {' | '.join(cells)} |"
            )
    return [*lines, ""]


def generation_section():
    results = load("generation")
    lines = [
        "## Greedy generation",
        "",
        "Tokens per second, 128 new tokens, decoder-only model (2 blocks, "
        "d=256, 4 heads, vocabulary 1000). *Whole loop compiled*: ours is "
        "`greedy_search(..., jit_compile=True)`, keras-hub's is its "
        "`GreedySampler` compiled as `CausalLM.generate` compiles it. "
        "*Python loop*: `greedy_search` driving a compiled step. PyTorch "
        "has no compiled form of either loop: both run eagerly there.",
        "",
        "| backend | batch | loop | ours, KV cache | keras-hub, cache "
        "| ours, no cache | ours / keras-hub | ours / keras-hub's Python "
        "loop | cache / no cache |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    labels = {"compiled": "whole loop compiled", "python": "Python loop"}
    for backend, data in results.items():
        rows = {
            (r["name"], r.get("loop", "python"), r["batch"]): r["tokens_per_s"]
            for r in data["rows"]
        }
        for batch in (1, 8):
            for loop, label in labels.items():
                if ("ours_cached", loop, batch) not in rows:
                    continue
                ours = rows[("ours_cached", loop, batch)]
                hub = rows[("keras_hub_cached", loop, batch)]
                uncached = rows[("ours_uncached", loop, batch)]
                hub_steps = rows[("keras_hub_cached", "python", batch)]
                lines.append(
                    f"| {backend} | {batch} | {label} | {ours:.0f} "
                    f"| {hub:.0f} | {uncached:.0f} | {ratio(ours, hub)} "
                    f"| {ratio(ours, hub_steps)} | {ratio(ours, uncached)} |"
                )
    lines += [
        "",
        "### Beam search",
        "",
        "Tokens per second (batch x new tokens / time), beam width 4, "
        "batch 8, 64 new tokens, length penalty 0.6, the same model with "
        "its KV cache. *Whole loop compiled* is `beam_search(..., "
        "jit_compile=True)`; the *Python loop* ranks the beams in NumPy "
        "and drives a compiled step. *Model alone* is compiled greedy "
        "search over as many rows as the beams (8 x 4 = 32), counted per "
        "sentence like the beams: the model's own arithmetic, a bound no "
        "beam search over this model can beat.",
        "",
        "| backend | whole loop compiled | Python loop | speed-up "
        "| model alone | compiled beam search against model alone "
        "| model alone against the Python loop |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        beam = {
            r["loop"]: r["tokens_per_s"]
            for r in data["rows"]
            if r["name"] == "beam"
        }
        floor = [
            r["tokens_per_s"] for r in data["rows"] if r["name"] == "beam_floor"
        ]
        if beam:
            bound = (
                f"| {floor[0]:.0f} | {beam['compiled'] / floor[0]:.2f}x "
                f"| {ratio(floor[0], beam['python'])} "
                if floor
                else "| - | - | - "
            )
            lines.append(
                f"| {backend} | {beam['compiled']:.0f} | {beam['python']:.0f} "
                f"| {ratio(beam['compiled'], beam['python'])} {bound}|"
            )
    return [*lines, ""]


def structure_section():
    results = load("structure")
    if not results:
        return []
    first = next(iter(results.values()))
    lines = [
        "## Attention structure",
        "",
        "### Sliding window",
        "",
        "`MultiHeadSelfAttention` training step, B="
        f"{first['window_batch']}, D=512, 8 heads, a causal window of "
        f"{first['window']} keys. *As argument*: `sliding_window="
        f"{first['window']}`; *as a dense mask*: the same layer given the "
        "same structure as `attention_mask` `(B, T, T)`; *keras MHA*: "
        "`keras.layers.MultiHeadAttention` with that mask. Peak memory of "
        "two training steps, each in its own process (as in *Memory*).",
        "",
        "| backend | T | as argument (ms) | as a dense mask (ms) "
        "| keras MHA, dense mask (ms) | speed-up over the dense mask "
        "| peak memory: argument / dense mask / keras MHA (MiB) "
        "| argument's memory over the dense mask's; over keras MHA's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        rows = {r["name"]: r for r in data["rows"]}
        window = rows["window"]
        mask, keras_mha = rows["window_as_mask"], rows["keras_mha_window_mask"]
        memory = " / ".join(
            "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
            for r in (window, mask, keras_mha)
        )
        lines.append(
            f"| {backend} | {window['length']} "
            f"| {window['seconds'] * 1e3:.0f} | {mask['seconds'] * 1e3:.0f} "
            f"| {keras_mha['seconds'] * 1e3:.0f} "
            f"| {ratio(mask['seconds'], window['seconds'])} | {memory} "
            f"| {ratio(window['peak_mib'], mask['peak_mib'])}; "
            f"{ratio(window['peak_mib'], keras_mha['peak_mib'])} |"
        )
    lines += [
        "",
        "### Packed sequences",
        "",
        "The same 48 sequences of random lengths, causal self-attention "
        "training step: padded to the longest (`padding_mask`) or packed "
        "into rows twice as long (`segment_ids`). Real tokens per second.",
        "",
        "| backend | padded batch | packed batch | padded (tokens/s) "
        "| packed (tokens/s) | speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        rows = {r["name"]: r for r in data["rows"]}
        padded, packed = rows["padded"], rows["packed"]
        lines.append(
            f"| {backend} | {padded['rows']} x {padded['row_length']} "
            f"| {packed['rows']} x {packed['row_length']} "
            f"| {padded['tokens_per_s']:.0f} | {packed['tokens_per_s']:.0f} "
            f"| {ratio(packed['tokens_per_s'], padded['tokens_per_s'])} |"
        )
    return [*lines, ""]


def mods_section():
    results = load("mods")
    if not results:
        return []
    lines = [
        "## Mask mods",
        "",
        "`MultiHeadSelfAttention` training step, B=2, T=4096, D=512, 8 "
        "heads, float32, for three patterns: a prefix-LM mask (prefix "
        "T/2), a document mask (8 documents of 512 tokens) and chunked "
        "attention (chunks of 512). *mod*: the pattern as a `mask_mod` of "
        "`keras_attention.mods`; *dense*: the same layer given the same "
        "pattern as `attention_mask` `(B, T, T)`; *keras MHA*: "
        "`keras.layers.MultiHeadAttention` with that mask. *visited* is "
        "the fraction of block pairs the blockwise path computes; *path* "
        "the one `explain()` names for the mod (`chunked`: the blockwise "
        "path).",
        "",
        "| backend | pattern | visited | path | mod (ms) | dense (ms) "
        "| keras MHA (ms) | speed-up over dense | over keras MHA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    kernel = [
        "",
        "A training step also runs the four projections, which the "
        "pattern does not change. The attention alone, forward and "
        "backward (the gradients of the query, key and value) on "
        "`(B, T, N, H)` heads: the `mask_mod`, the same mod as a "
        "`block_mask` made once (blocks of 256, the default), as a "
        "`block_mask(..., block_size=512)` (*visited* in blocks of 512: "
        "*visited 512*), and the dense mask. The ideal speed-up over the "
        "dense mask is 1 / *visited*.",
        "",
        "| backend | pattern | visited | visited 512 | mod (ms) "
        "| block mask (ms) | blocks of 512 (ms) | dense (ms) "
        "| mod over dense | block mask over dense "
        "| blocks of 512 over dense | ideal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- | --- |",
    ]
    for backend, data in results.items():
        patterns = {}
        for row in data["rows"]:
            patterns.setdefault(row["pattern"], {})[row["name"]] = row
        for pattern, rows in patterns.items():
            mod, dense = rows["mod"], rows["dense"]
            keras_mha, visited = rows["keras_mha"], mod["visited"]
            lines.append(
                f"| {backend} | {pattern} | {visited:.0%} | {mod['path']} "
                f"| {mod['seconds'] * 1e3:.0f} | {dense['seconds'] * 1e3:.0f} "
                f"| {keras_mha['seconds'] * 1e3:.0f} "
                f"| {ratio(dense['seconds'], mod['seconds'])} "
                f"| {ratio(keras_mha['seconds'], mod['seconds'])} |"
            )
            if "kernel_mod" not in rows:
                continue
            names = (
                "kernel_mod",
                "kernel_block_mask",
                "kernel_block_mask_512",
                "kernel_dense",
            )
            seconds = [rows[n]["seconds"] for n in names]
            large = rows["kernel_block_mask_512"]["visited"]
            kernel.append(
                f"| {backend} | {pattern} | {visited:.0%} | {large:.0%} "
                + "".join(f"| {t * 1e3:.0f} " for t in seconds)
                + "".join(f"| {ratio(seconds[3], t)} " for t in seconds[:3])
                + f"| {1 / visited:.1f}x |"
            )
    return [*lines, *kernel, ""]


def relative_bias_section():
    results = load("relative_bias")
    if not results:
        return []
    lines = [
        "## T5's relative position bias",
        "",
        "T5's encoder layer (pre-RMSNorm, no biases, T5's learned "
        "relative position bias with 32 buckets and maximum distance 128), "
        "D=512, 8 heads, feed-forward 2048, float32, B=4, training step: "
        "`TransformerEncoderBlock(normalize_first=True, use_bias=False, "
        "use_rms_norm=True, score_mod=RelativePositionBias())` against "
        "keras-hub's `T5TransformerLayer`, which adds the `(1, N, T, T)` "
        "bias to dense logits. Given keras-hub's weights (its query "
        "kernel times $\\sqrt{H}$, as T5 leaves its logits unscaled), "
        "ours computes keras-hub's outputs; *path* is the one `explain()` "
        "names for ours.",
        "",
        "| backend | T | path | ours (ms) | keras-hub T5 (ms) | speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    runs = {}  # {(backend, T): {name: row}}
    for backend, data in results.items():
        for row in data["rows"]:
            runs.setdefault((backend, row["length"]), {})[row["name"]] = row
    for (backend, length), rows in runs.items():
        ours, hub = rows["ours"], rows["keras_hub"]
        lines.append(
            f"| {backend} | {length} | {ours['path']} "
            f"| {ours['seconds'] * 1e3:.0f} "
            f"| {hub['seconds'] * 1e3:.0f} "
            f"| {ratio(hub['seconds'], ours['seconds'])} |"
        )
    lines += [
        "",
        "The attention alone, forward and backward (the gradients of the "
        "query, key, value and the `(32, N)` table), on the same path: "
        "`mods.relative_position_bias`, which the blockwise and reference "
        "paths lay along the diagonals of each block of logits (one "
        "lookup per relative position), against the same bias as a score "
        "mod written by hand (one bucket and table lookup per logit).",
        "",
        "| backend | T | library mod (ms) | hand-written mod (ms) | speed-up |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (backend, length), rows in runs.items():
        if "kernel_library" not in rows:
            continue
        ours, hand = rows["kernel_library"], rows["kernel_elementwise"]
        lines.append(
            f"| {backend} | {length} "
            f"| {ours['seconds'] * 1e3:.0f} "
            f"| {hand['seconds'] * 1e3:.0f} "
            f"| {ratio(hand['seconds'], ours['seconds'])} |"
        )
    return [*lines, ""]


def rnn_section():
    results = load("rnn_decoder")
    lines = [
        "## AttentionDecoder step",
        "",
        "Milliseconds per decoding step, batch 8, source length 256, GRU 256 "
        "with Bahdanau attention (256 units), compiled step.",
        "",
        "| backend | keys projected once | keys projected every step "
        "| speed-up |",
        "| --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        rows = {r["name"]: r["step_ms"] for r in data["rows"]}
        lines.append(
            f"| {backend} | {rows['precomputed']:.3f} "
            f"| {rows['recomputed']:.3f} "
            f"| {ratio(rows['recomputed'], rows['precomputed'])} |"
        )
    return [*lines, ""]


def quantization_section():
    results = load("quantization")
    if not results:
        return []
    first = next(iter(results.values()))
    lines = [
        "## int8 quantization",
        "",
        "A decoder-only language model (token embedding, "
        f"{first['layers']} `TransformerDecoderBlock` with d={first['D']}, "
        f"{first['N']} heads, feed-forward {first['intermediate_dim']}, "
        f"output projection to {first['vocabulary']} tokens) in float32 and "
        'after `model.quantize("int8")` (every projection of our layers and '
        "the output projection), the same weights, measured side by side. "
        "Forward: milliseconds (median) of `predict_on_batch`; "
        "*speed-up* is float32 time over int8 time. *error* is the largest "
        "deviation of the int8 logits over the largest float32 logit; "
        "*argmax* the fraction of positions whose most likely token is "
        "unchanged.",
        "",
        "| backend | batch x T | float32 (ms) | int8 (ms) | speed-up "
        "| error | argmax |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        rows = {(r["name"], r["batch"], r["T"]): r for r in data["rows"]}
        for batch, length in sorted(
            {(r["batch"], r["T"]) for r in data["rows"]}, reverse=True
        ):
            full = rows[("float32", batch, length)]["ms"]
            int8 = rows[("int8", batch, length)]["ms"]
            error = rows[("int8_error", batch, length)]
            lines.append(
                f"| {backend} | {batch} x {length} | {full:.1f} | {int8:.1f} "
                f"| {ratio(full, int8)} "
                f"| {100 * error['relative_error']:.1f}% "
                f"| {100 * error['argmax_agreement']:.1f}% |"
            )
    lines += [
        "",
        "| backend | weights float32 (MB) | weights int8 (MB) | ratio "
        "| `.keras` float32 (MB) | `.keras` int8 (MB) | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        sizes = {r["name"]: r for r in data["sizes"]}
        full, int8 = sizes["float32"], sizes["int8"]
        lines.append(
            f"| {backend} | {full['weight_bytes'] / 1e6:.2f} "
            f"| {int8['weight_bytes'] / 1e6:.2f} "
            f"| {ratio(full['weight_bytes'], int8['weight_bytes'])} "
            f"| {full['file_bytes'] / 1e6:.2f} "
            f"| {int8['file_bytes'] / 1e6:.2f} "
            f"| {ratio(full['file_bytes'], int8['file_bytes'])} |"
        )
    lines += [
        "",
        "int8 is a size win: the kernels take a quarter of their float32 "
        "bytes (the token embedding, the LayerNorms and the biases stay "
        "float32, hence 2.7x overall rather than 4x). On these CPUs it is "
        "not a speed win: Keras quantizes the activations of every "
        "projection at every call and, outside XLA, has no fused int8 "
        "matmul to run, so TensorFlow's graph and PyTorch's eager mode "
        "lose time on large batches; under `jax.jit` XLA fuses the "
        "quantization and the int8 matmul.",
    ]
    return [*lines, ""]


def gpu_section():
    results = {b: d for b, d in load("gpu").items() if not d.get("quick")}
    lines = ["## On a GPU", ""]
    if not results:
        return [
            *lines,
            "No GPU figures yet: every figure on this page was measured on "
            "a CPU. `benchmarks/gpu.py` measures bfloat16 attention and "
            "training steps against the backend's raw fused kernel.",
            "",
        ]
    lines += [
        "bfloat16, attention alone: TFLOP/s of ours and of the raw fused "
        "op in the same process (`jax.nn.dot_product_attention("
        'implementation="cudnn")`, `torch.nn.functional.'
        "scaled_dot_product_attention`).",
        "",
        "| backend | GPU | T | head dim | causal | ours fwd | raw fwd "
        "| ours fwd+bwd | raw fwd+bwd |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, data in results.items():
        for r in data["rows"]:
            if r.get("kind") != "attention":
                continue
            lines.append(
                f"| {backend} | {data.get('gpu', '-')} | {r['length']} "
                f"| {r['head_dim']} | {'yes' if r['causal'] else 'no'} "
                + " ".join(
                    f"| {r.get(f'{who}_{kind}_tflops') or 0:.0f}"
                    for kind in ("fwd", "fwdbwd")
                    for who in ("ours", "raw")
                )
                + " |"
            )
    return [*lines, ""]


def context_parallel_tables():
    """The tables of `benchmarks/context_parallel.py`, which the Performance
    page and the "Long sequences across devices" guide both show."""
    data = load("context_parallel").get("jax")
    if data is None:
        return ["No context-parallel figures yet."]
    mib = 2**20
    attention = data["attention"]
    first = data["attention_memory"][0]  # one device
    base = first["temporaries"] + first["inputs_outputs"]
    lines = [
        "Per device, from XLA's memory analysis of the compiled training "
        "step (forward and backward) of causal attention alone, ring "
        f"exchange, B = {attention['batch']}, T = {attention['length']}, "
        f"{attention['heads']} heads of {attention['head_dim']}, float32, "
        "on a `(1, P)` mesh of simulated CPU devices:",
        "",
        "| devices `P` | inputs and outputs | temporaries | total "
        "| total / one device |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in data["attention_memory"]:
        total = row["temporaries"] + row["inputs_outputs"]
        lines.append(
            f"| {row['devices']} | {row['inputs_outputs'] / mib:.0f} MiB "
            f"| {row['temporaries'] / mib:.0f} MiB | {total / mib:.0f} MiB "
            f"| {total / base:.2f} |"
        )
    model, memory = data["model"], data["model_memory"]
    one, shared = (
        sum(memory[k].values()) for k in ("one_device", "per_device")
    )
    devices = data["balance_devices"]
    lines += [
        "",
        f"The training step of the mini GPT ({model['layers']} blocks of "
        f"{model['units']} units, {model['heads']} query and "
        f"{model['kv_heads']} key/value heads, rotary positions) at T = "
        f"{model['sequence_length']}: {one / mib:.0f} MiB on one device, "
        f"{shared / mib:.0f} MiB per device on {devices} "
        f"({shared / one:.2f} of it).",
        "",
        f"Chunk pairs each of {devices} devices visits for causal "
        "attention, from the plan:",
        "",
        "| order | " + " | ".join(f"device {d}" for d in range(devices)) + " |",
        "| --- " * (devices + 1) + "|",
    ]
    for order in ("contiguous", "zigzag"):
        counts = " | ".join(map(str, data["balance"][order]))
        lines.append(f"| {order.replace('zigzag', 'zig-zag')} | {counts} |")
    return lines


def context_parallel_section():
    return [
        "## Across devices",
        "",
        "`ContextParallel` (JAX), from `benchmarks/context_parallel.py`; "
        "see [Long sequences across devices](guides/long-sequences.md).",
        "",
        *context_parallel_tables(),
        "",
    ]


def render(plot=True):
    """The text of docs/performance.md; `plot` also draws its figure."""
    lines = [INTRO.rstrip(), ""]
    lines += layers_section(plot)
    lines += causal_section()
    lines += paths_section()
    lines += kernel_forms_section()
    lines += memory_section()
    lines += generation_section()
    lines += structure_section()
    lines += mods_section()
    lines += relative_bias_section()
    lines += rnn_section()
    lines += quantization_section()
    lines += context_parallel_section()
    lines += gpu_section()
    return "\n".join(lines)


def main():
    (DOCS / "performance.md").write_text(render())
    print(f"wrote {DOCS / 'performance.md'}")
    SNIPPET.write_text("\n".join(context_parallel_tables()) + "\n")
    print(f"wrote {SNIPPET}")


if __name__ == "__main__":
    main()
