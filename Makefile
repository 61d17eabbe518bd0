# Set-up is two commands: `make demo` and `make test`. Both create .venv on first use
# and install the project with its extras under constraints/test.txt (the tested versions).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Tests and the demo see 8 fake CPU devices, so sharded code paths run everywhere.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
# Nothing is ever downloaded from a model hub, by tests or by the demo.
export HF_HUB_OFFLINE := 1

.PHONY: demo test lint venv bench fixtures optim-fixtures flax-fixtures maxtext-fixtures hf-table clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints/common.txt constraints/test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -c constraints/test.txt -e ".[torch,hf,test]"
	$(BIN)/python -m pip install --quiet --no-deps -c constraints/test.txt google-tunix==0.1.7
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/jaxshare demo

# Lint, layering contract, types, then the whole suite (doctests, docs and README included).
# mypy checks jaxshare/ and bridge/ ([tool.mypy] in pyproject.toml); its cache is .mypy_cache/.
lint: $(STAMP)
	$(BIN)/ruff check jaxshare bridge tests examples benchmarks conftest.py
	$(BIN)/ruff format --check --quiet jaxshare bridge tests examples benchmarks conftest.py
	$(BIN)/lint-imports
	$(BIN)/mypy

# A worker that dies (a crash in native code) fails the run at once, naming the test it
# ran, where a restarted worker could leave xdist waiting until CI's limit.
test: lint
	$(BIN)/python -m pytest -q -n 2 --max-worker-restart=0

# Benchmarks compare against peers (transformers 4.57, deepspeed, accelerate) that live
# in their own venv, so they never change the tested set in .venv.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed-stamp: pyproject.toml constraints/common.txt constraints/bench.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	DS_BUILD_OPS=0 $(BENCH_VENV)/bin/python -m pip install --quiet -c constraints/bench.txt -e ".[torch,test,bench]"
	touch $@

bench: $(BENCH_VENV)/.installed-stamp
	for b in benchmarks/*.py; do $(BENCH_VENV)/bin/python $$b || exit 1; done

# The DeepSpeed ZeRO checkpoints under tests/data/deepspeed, written by the real DeepSpeed
# on the CPU (gloo; its CPU communication op is compiled once into build/). `make test`
# reads the committed folders and never needs deepspeed.
fixtures: $(BENCH_VENV)/.installed-stamp
	DS_ACCELERATOR=cpu DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=$(CURDIR)/build/torch_extensions \
		$(BENCH_VENV)/bin/python tests/data/deepspeed/make_fixtures.py

# The DeepSpeed training states under tests/data/deepspeed_optim (moments, step, groups, and
# five further steps recorded for the resume tests), by the real DeepSpeed as above.
optim-fixtures: $(BENCH_VENV)/.installed-stamp
	DS_ACCELERATOR=cpu DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=$(CURDIR)/build/torch_extensions \
		$(BENCH_VENV)/bin/python tests/data/deepspeed_optim/make_fixtures.py

# The parameter trees of transformers 4.57's Flax classes under tests/data/transformers_flax,
# for the transformers-flax layout; transformers 5 (in .venv) has no Flax classes.
flax-fixtures: $(BENCH_VENV)/.installed-stamp
	HF_HUB_OFFLINE=1 $(BENCH_VENV)/bin/python tests/data/transformers_flax/make_fixtures.py

# bridge/hf/table.json: the ties, layer kinds and tensor order of transformers' model
# classes, each built on the meta device, so reading a directory imports neither
# transformers nor torch (tests/bridge/test_hf_table.py checks it against them).
hf-table: $(STAMP)
	$(BIN)/python -m bridge.hf.meta

# MaxText-layout items of tiny Llama, Mistral and Gemma models, by MaxText's mapping.
maxtext-fixtures: $(STAMP)
	$(BIN)/python tests/data/maxtext/make_fixture.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache

# Flax params -> Orbax -> HF directory in transformers 4.57's PyTorch classes, and back into
# its Flax classes (jaxshare runs in .venv; the models in .venv-bench). Not run by CI: it
# rewrites the committed tests/data/transformers_flax/check_transformers4.log.
.PHONY: check-transformers4
check-transformers4: $(STAMP) $(BENCH_VENV)/.installed-stamp
	HF_HUB_OFFLINE=1 $(BENCH_VENV)/bin/python tests/data/transformers_flax/check_transformers4.py
