# The README's two commands: `make demo` (the main job) and `make test`.
# Each creates .venv and installs what it needs on a fresh machine.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BACKENDS := tensorflow jax torch
PYTEST_ARGS ?=
# Each backend's pass runs its test files on this many pytest-xdist workers
# (a file stays on one worker, so it builds its shared models once), in the
# order tests/conftest.py gives them: the long files first.
# A worker that crashes ends the pass (--max-worker-restart=0), naming the
# test it was running: pytest-xdist 3.8 hangs when it replaces a crashed
# worker under --dist loadfile.
TEST_WORKERS ?= 2
PYTEST := -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	--max-worker-restart=0
export TF_CPP_MIN_LOG_LEVEL := 3
export NO_MKDOCS_2_WARNING := 1

KATEX := docs/assets/katex

.PHONY: install lint format test test-% demo bench docs docs-assets \
	docs-serve chromium gpu-wheels gpu-check \
	clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# --no-compile: byte-compiling every installed module (TensorFlow, JAX,
	# PyTorch) takes minutes; Python compiles what it imports, when it does.
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt \
		-e ".[dev,jax,torch]" tensorflow-cpu
	# keras-hub without tensorflow-text, which would replace tensorflow-cpu
	# with full tensorflow; its other imports come with the [dev] extra.
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt \
		--no-deps keras-hub
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/architecture_figures.py --check

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Headless Debian chromium renders the docs in the tests.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# Lint, the strict docs build, then the whole suite once per backend, each in
# its own processes (KERAS_BACKEND is fixed at import), timed. Every backend
# runs even if one fails; the target fails if any did.
test: lint docs chromium
	@failed=""; \
	for backend in $(BACKENDS); do \
		echo "=== pytest, KERAS_BACKEND=$$backend ==="; \
		start=$$(date +%s); \
		KERAS_BACKEND=$$backend $(BIN)/python $(PYTEST) $(PYTEST_ARGS) \
			|| failed="$$failed $$backend"; \
		echo "=== KERAS_BACKEND=$$backend: $$(( $$(date +%s) - start )) s ==="; \
	done; \
	if [ -n "$$failed" ]; then echo "FAILED on:$$failed"; exit 1; fi; \
	echo "all backends passed: $(BACKENDS)"

test-%: $(STAMP)
	KERAS_BACKEND=$* $(BIN)/python $(PYTEST) $(PYTEST_ARGS)

# The main job: Bahdanau-attention NMT of German number words into English on
# JAX; prints test exact match, BLEU and chrF and writes alignment plots. It
# is the run examples/README.md quotes (8 epochs, about 3 minutes on 2 cores),
# and it rewrites that run's record in examples/results.
demo: $(STAMP)
	KERAS_BACKEND=jax $(BIN)/python examples/nmt_rnn_attention.py \
		--backend jax --attention bahdanau --data numbers \
		--output examples/output

# KaTeX comes from npm at the version package-lock.json pins and is served
# with the site: viewing the docs needs no network.
$(KATEX)/katex.min.js: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	rm -rf $(KATEX) && mkdir -p $(KATEX)
	cp -r node_modules/katex/dist/katex.min.js \
		node_modules/katex/dist/katex.min.css \
		node_modules/katex/dist/fonts node_modules/katex/dist/contrib $(KATEX)/

docs-assets: $(KATEX)/katex.min.js

docs: $(STAMP) $(KATEX)/katex.min.js
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP) $(KATEX)/katex.min.js
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) build dist site .pytest_cache .ruff_cache .hypothesis \
		node_modules $(KATEX)

# Every benchmark once per backend, each in its own process, then the
# tables and plots of docs/performance.md. BENCH_ARGS=--quick for a short run.
BENCHMARKS := layers causal paths memory generation structure mods relative_bias \
	rnn_decoder quantization context_parallel kernel_forms
BENCH_ARGS ?=
bench: $(STAMP)
	cd benchmarks && for backend in $(BACKENDS); do \
		for bench in $(BENCHMARKS); do \
			KERAS_BACKEND=$$backend ../$(BIN)/python $$bench.py \
				$(BENCH_ARGS) || exit 1; \
		done; \
	done
	$(BIN)/python benchmarks/report.py

# The GPU check: the GPU-relevant tests and benchmarks/gpu.py on
# JAX and PyTorch in one call of at most 9 minutes, on a machine that has
# JAX, PyTorch, pytest and hypothesis but no Keras and no network. Here,
# `make gpu-wheels` puts in .whl (git-ignored) the wheels that machine
# lacks: Keras at its pinned version and the two dependencies it does not
# have. There, `make gpu-check` (or `python3 benchmarks/gpu_check.py`)
# installs them in a temporary folder and writes logs and results under
# $OUT (else build/gpu-check). CONTRIBUTING.md says how to run it.
GPU_WHEELS := $(shell grep '^keras==' constraints.txt) namex==0.1.0 \
	optree==0.20.0
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_17,--platform manylinux_$(n)_x86_64) \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=

gpu-wheels:
	grep -qx '/.whl/' .git/info/exclude 2>/dev/null \
		|| { mkdir -p .git/info && echo '/.whl/' >> .git/info/exclude; }
	rm -rf .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp $(GPU_PLATFORMS) \
		-d .whl $(GPU_WHEELS)
	@ls .whl; du -sh .whl

gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
