# Two commands for a fresh machine; each sets up what it needs (virtual environment, pinned install).
#   make quickstart   offline FedAvg on scikit-learn's digits (about a minute on 2 CPU cores)
#   make test         lint + the fast test suite (what CI runs)
#   make bench-quick  every attack x every defence, quick preset (docs/reproduction.md, "Attacks x defences")
#   make bench        the full preset of the same grid (hours on 2 cores; resumable)
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_MODE ?= offline

.PHONY: quickstart test lint format clean bench bench-quick

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch and torchvision are pinned exactly in pyproject.toml and installed in this one pip command.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

quickstart: $(VENV)/.installed
	$(BIN)/lightning-fl fit --config configs/quickstart.yaml

bench-quick: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(BIN)/lightning-fl bench --config configs/bench_digits.yaml --quick --jobs 2

bench: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(BIN)/lightning-fl bench --config configs/bench_digits.yaml --jobs 2

test: $(VENV)/.installed
	$(BIN)/ruff check lightning_fl tests benchmarks
	$(BIN)/ruff format --check lightning_fl tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/pytest -n 2 -m "not slow" tests
	OMP_NUM_THREADS=1 $(BIN)/pytest -p no:cacheprovider --doctest-modules lightning_fl -q

format: $(VENV)/.installed
	$(BIN)/ruff format lightning_fl tests benchmarks
	$(BIN)/ruff check --fix lightning_fl tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
