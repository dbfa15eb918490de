# Two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv idempotently.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch; on a GPU host use e.g. `make TORCH_SPEC=torch==2.11.0 run`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.opsynth-installed
TEST_STAMP := $(VENV)/.opsynth-test-installed
# Holds the TORCH_SPEC last asked for, rewritten only when it changes: a changed spec makes
# the install stamp stale, so `make TORCH_SPEC=... run` on an existing venv installs that torch.
TORCH_STAMP := $(VENV)/.opsynth-torch-spec
$(shell mkdir -p $(VENV) && { [ "$$(cat $(TORCH_STAMP) 2>/dev/null)" = '$(TORCH_SPEC)' ] || printf '%s\n' '$(TORCH_SPEC)' > $(TORCH_STAMP); })
# llama-cpp-python builds from source (5-15 min on 2 cores; pip keeps the wheel in its cache).
# A portable build: a native one probes AVX-512/AMX, which some VMs advertise but fault on.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF

.PHONY: run test lint format setup clean

$(STAMP): pyproject.toml Makefile $(TORCH_STAMP)
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap libseccomp2) >/dev/null || echo "warning: bubblewrap not installed; task code will not run without --unsafe"; \
	  else echo "warning: bubblewrap missing (install the Debian packages 'bubblewrap' and 'libseccomp2'); task code will not run without --unsafe"; fi; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,dask,train]"
	@if CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q -e ".[dev,llm-test,dask,train]"; \
	then touch $(TEST_STAMP); \
	else echo "warning: llama-cpp-python did not install; the local-LLM test will skip"; fi

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/opsynth run --out runs/default

test: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q --durations=25

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf runs .pytest_cache .ruff_cache
