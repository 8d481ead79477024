# Two commands for a fresh machine; each sets up what it needs (virtual environment, pinned install).
#   make quickstart   offline FedAvg on scikit-learn's digits (about a minute on 2 CPU cores)
#   make test         lint + the fast test suite (what CI runs)
#   make bench-quick  every attack x every defence x threat model, quick preset (docs/bench.md)
#   make bench        the full preset of the same grid (about 30 CPU-minutes; resumable)
#   make reproduce    every table of docs/reproduction.md, one command after another (several hours on 2 cores);
#                     each command's output goes to runs/reproduce/<target>.txt (see "Which command regenerates
#                     which table" there); the reproduce-* targets run one section each
#   make reproduce-gpu  the GPU rows (Inverting Gradients on ResNet-18, GRNN batches); needs a CUDA GPU, not
#                     part of `make reproduce`
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_MODE ?= offline
SHELL := bash
.SHELLFLAGS := -o pipefail -c   # a command piped into tee still fails the target when it fails

.PHONY: quickstart test lint format clean bench bench-quick reproduce reproduce-gpu $(REPRODUCE)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch and torchvision are pinned exactly in pyproject.toml and installed in this one pip command.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

quickstart: $(VENV)/.installed
	$(BIN)/lightning-fl fit --config configs/quickstart.yaml

# Each bench job process sets its own torch thread count (cores / jobs): no OMP_NUM_THREADS needed.
bench-quick: $(VENV)/.installed
	$(BIN)/lightning-fl bench --config configs/bench_digits.yaml --quick --jobs 2

bench: $(VENV)/.installed
	$(BIN)/lightning-fl bench --config configs/bench_digits.yaml --jobs 2

# docs/reproduction.md, "Which command regenerates which table": one target per row, run in this order.
REPRODUCE := reproduce-bench reproduce-foundation reproduce-attacks reproduce-grnn reproduce-model-defences \
	reproduce-model-defences-loop reproduce-dp reproduce-pogz reproduce-fedboosting
OUT := runs/reproduce
RUN = OMP_NUM_THREADS=1 PYTHONPATH=$(CURDIR)
LOG = 2>&1 | tee $(OUT)/$@.txt

reproduce: $(REPRODUCE)
	@echo "make reproduce: every table's output is in $(OUT)/"

$(REPRODUCE): $(VENV)/.installed | $(OUT)

$(OUT):
	mkdir -p $@

reproduce-bench:
	{ $(BIN)/lightning-fl bench --config configs/bench_digits.yaml --quick --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos.yaml --quick --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_digits.yaml --jobs 2; } $(LOG)

reproduce-foundation:
	{ $(RUN) $(BIN)/lightning-fl fit --config configs/quickstart.yaml && \
	  $(RUN) $(BIN)/pytest -p no:cacheprovider -q tests/federation/test_loop.py -k quickstart; } $(LOG)

reproduce-attacks:
	{ for attack in dlg idlg ig; do \
	    $(RUN) $(BIN)/lightning-fl attack --config configs/$${attack}_lenet_digits.yaml \
	      --output_dir $(OUT)/$${attack}_lenet_digits || exit 1; done && \
	  $(RUN) $(BIN)/python benchmarks/dlg_thesis_tables.py && \
	  $(RUN) $(BIN)/python benchmarks/attack_parity.py && \
	  $(RUN) $(BIN)/python benchmarks/batch_recovery.py --attack dlg --data digits --batch-size 4; } $(LOG)

reproduce-gpu: $(VENV)/.installed | $(OUT)
	$(RUN) PYTHON=$(BIN)/python bash benchmarks/gpu_attacks.sh $(OUT)/gpu $(LOG)

reproduce-grnn:
	$(RUN) $(BIN)/python benchmarks/grnn_tables.py $(LOG)

reproduce-model-defences:
	$(RUN) $(BIN)/python benchmarks/defence_tables.py --images 4 $(LOG)

reproduce-model-defences-loop:
	{ $(RUN) $(BIN)/lightning-fl fit --config configs/fedkl_digits.yaml --output_dir $(OUT)/fedkl_digits && \
	  $(RUN) $(BIN)/lightning-fl fit --config configs/fdl_pp_digits.yaml --output_dir $(OUT)/fdl_pp_digits && \
	  $(RUN) $(BIN)/python benchmarks/fdl_pp_rounds.py; } $(LOG)

reproduce-dp:
	{ $(RUN) $(BIN)/python benchmarks/dp_tables.py --out $(OUT)/dp_tables.json && \
	  $(RUN) $(BIN)/python benchmarks/fed_dp_clients_per_round.py; } $(LOG)

reproduce-pogz:
	{ $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --allocations pogz even inverse && \
	  $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --nets paper2 --image-size 28 --epsilons 5 10 20 50 100 200 && \
	  $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --placements once --alpha-fraction 0.01 --epsilons 0.5 1 5 10; \
	} $(LOG)

reproduce-fedboosting:
	{ $(RUN) $(BIN)/python benchmarks/fedboosting_tables.py && \
	  $(RUN) $(BIN)/python benchmarks/fedboosting_vs_fedavg.py --seeds 0 1 2 --alphas 0.3 1.0; } $(LOG)

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
