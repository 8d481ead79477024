# Two commands for a fresh machine; each sets up what it needs (virtual environment, pinned install).
#   make quickstart   offline FedAvg on scikit-learn's digits (about a minute on 2 CPU cores)
#   make test         lint + the fast test suite (what CI runs)
#   make bench-quick  every attack x every defence x threat model, quick preset (docs/bench.md)
#   make bench        the full preset of the same grid (about 30 CPU-minutes; resumable)
#   make reproduce    the command of every table quoted in docs/, one after another (many hours on 2 cores);
#                     each target's output goes to runs/reproduce/<target>.txt (see "Which command regenerates
#                     which table" in docs/reproduction.md); the reproduce-* targets run one section each
#   make reproduce-gpu  the GPU rows (Inverting Gradients on ResNet-18, GRNN batches, the GPU checks; with
#                     BREACHING_PATH=DIR also breaching's ResNet-18 rows); needs a CUDA GPU, not part of `make reproduce`
#   make reproduce-breaching BREACHING_PATH=DIR:DEPS  the parity rows against breaching 0.1.2, installed outside the
#                     project (see benchmarks/breaching_parity.py); not part of `make reproduce`
# tests/test_reproduce_list.py checks that every script and config a doc quotes is run by a reproduce-* target.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_MODE ?= offline
SHELL := bash
.SHELLFLAGS := -o pipefail -c   # a command piped into tee still fails the target when it fails

.PHONY: quickstart test lint format clean bench bench-quick reproduce reproduce-gpu reproduce-breaching

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

# docs/reproduction.md, "Which command regenerates which table": one target per section, run in this order.
REPRODUCE := reproduce-bench reproduce-foundation reproduce-attacks reproduce-attacks-2026 reproduce-grnn \
	reproduce-model-defences reproduce-model-defences-loop reproduce-dp reproduce-pogz reproduce-fedboosting \
	reproduce-algorithms reproduce-secure-aggregation reproduce-performance
.PHONY: $(REPRODUCE)
OUT := runs/reproduce
RUN = OMP_NUM_THREADS=1 PYTHONPATH=$(CURDIR)
RUN_USER_NET = OMP_NUM_THREADS=1 PYTHONPATH=$(CURDIR):$(CURDIR)/benchmarks
# benchmarks/user_convnet.py importable: a user's own model given as --model user_convnet.UserConvNet
CONVNET_IG = --model.init_args.backbone convnet --attack.init_args.tv_weight 4 --attack.init_args.bn_weight 0.1
# configs/inverting_gradients_full.yaml with the prior weights measured best on the eight-layer ConvNet
LOG = 2>&1 | tee $(OUT)/$@.txt
BREACHING_PATH ?=

reproduce: $(REPRODUCE)
	@echo "make reproduce: every table's output is in $(OUT)/"

$(REPRODUCE) reproduce-gpu reproduce-breaching: $(VENV)/.installed | $(OUT)

$(OUT):
	mkdir -p $@

reproduce-bench:
	{ $(BIN)/lightning-fl bench --config configs/bench_digits.yaml --quick --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos.yaml --quick --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_lfw.yaml --quick --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_digits.yaml --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_digits_dp.yaml --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_digits_dp_3_clients.yaml --jobs 1 && \
	  $(BIN)/lightning-fl bench --config configs/bench_digits_rounds.yaml --jobs 1 && \
	  $(BIN)/lightning-fl bench --config configs/bench_digits_cross_device.yaml --jobs 2 && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos_user_net.yaml --quick --seeds 0,1,2 --jobs 2 \
	    --defences none,fedkl_keylock,fdl_pp_passports,gaussian_noise,pruning_70,precode,mixup && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos_user_net.yaml --quick --seeds 0 --jobs 2 \
	    --defences none,fedkl_keylock,fdl_pp_passports,gaussian_noise,pruning_70,precode,mixup \
	    --threat_models fedsgd_b1,fedsgd_b1_trained,aggregate_k4 --output_dir runs/bench_photos_user_net_threats && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos_user_net.yaml --seeds 0,1,2 --jobs 2 \
	    --defences none,fedkl_keylock,fdl_pp_passports,gaussian_noise,pruning_70,mixup --threat_models fedsgd_b1 \
	    --attacks ig,grnn,ig_known_mask,ig_noise_aware,ig_keylock_unknowns,ig_passport_unknowns,robbing_the_fed,prior_mean,prior_class && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos_user_net.yaml --seeds 0 --jobs 2 \
	    --defences none,fedkl_keylock,fdl_pp_passports,gaussian_noise,pruning_70 --threat_models fedsgd_b1_trained \
	    --attacks ig,ig_known_mask,ig_noise_aware,ig_keylock_unknowns,ig_passport_unknowns,prior_mean,prior_class \
	    --output_dir runs/bench_photos_user_net_trained; } $(LOG)

reproduce-foundation:
	{ $(RUN) $(BIN)/lightning-fl fit --config configs/quickstart.yaml --output_dir $(OUT)/quickstart && \
	  $(RUN) $(BIN)/pytest -p no:cacheprovider -q tests/federation/test_loop.py -k quickstart; } $(LOG)

# docs/attacks.md and docs/reproduction.md: DLG, iDLG, Inverting Gradients, GRNN-free rows of the thesis.
reproduce-attacks:
	{ $(RUN) $(BIN)/lightning-fl attack --config configs/dlg_lenet_digits.yaml --output_dir $(OUT)/dlg_lenet_digits && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/idlg_lenet_digits.yaml --output_dir $(OUT)/idlg_lenet_digits && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/ig_lenet_digits.yaml --output_dir $(OUT)/ig_lenet_digits && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/dlg_lenet_digits.yaml --run.batch_size 8 \
	    --output_dir $(OUT)/dlg_lenet_digits_b8 && \
	  $(RUN) $(BIN)/lightning-fl fit --config configs/dlg_lenet_digits_fedsgd.yaml --output_dir $(OUT)/dlg_fedsgd && \
	  $(RUN) $(BIN)/python benchmarks/dlg_thesis_tables.py && \
	  $(RUN) $(BIN)/python benchmarks/attack_parity.py && \
	  $(RUN) $(BIN)/python benchmarks/batch_recovery.py --attack dlg --data digits --batch-size 4 && \
	  $(RUN) $(BIN)/python benchmarks/attack_user_model.py && \
	  $(RUN) $(BIN)/python benchmarks/attack_user_model.py --before && \
	  $(RUN) $(BIN)/python benchmarks/attack_bisect.py; } $(LOG)

# docs/attacks.md, issue 21: label counts, the analytic attack, Robbing the Fed, See-Through-Gradients.
reproduce-attacks-2026:
	{ $(RUN) $(BIN)/python benchmarks/label_recovery.py && \
	  $(RUN) $(BIN)/python benchmarks/label_recovery.py --local-steps 2 && \
	  $(RUN) $(BIN)/python benchmarks/analytic_attack.py && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/analytic_mlp_digits.yaml --output_dir $(OUT)/analytic && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/robbing_the_fed_digits.yaml --output_dir $(OUT)/rtf_digits && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/robbing_the_fed_photos.yaml --output_dir $(OUT)/rtf_photos && \
	  $(RUN) $(BIN)/python benchmarks/robbing_the_fed.py --part batch && \
	  $(RUN) $(BIN)/python benchmarks/robbing_the_fed.py --part defences && \
	  $(RUN) $(BIN)/python benchmarks/see_through_gradients.py && \
	  $(RUN) $(BIN)/lightning-fl fit --config configs/see_through_gradients_resnet_digits.yaml \
	    --output_dir $(OUT)/stg_resnet_digits && \
	  $(RUN) $(BIN)/lightning-fl attack -c configs/see_through_gradients.yaml --output_dir $(OUT)/stg && \
	  $(RUN) $(BIN)/lightning-fl attack -c configs/see_through_gradients.yaml --seed_everything 1 \
	    --output_dir $(OUT)/stg_s1 && \
	  $(RUN) $(BIN)/lightning-fl attack -c configs/see_through_gradients.yaml --seed_everything 1 \
	    --run.bn_statistics_client null --output_dir $(OUT)/stg_s1_initial_bn && \
	  for s in shipped pixel_units leaked_bn full; do \
	    $(RUN) $(BIN)/python benchmarks/ig_relu_convnet.py --setting $$s --tiles 0 80 240 || exit 1; done && \
	  for seed in 0 1 2; do \
	    $(RUN_USER_NET) $(BIN)/lightning-fl attack -c configs/inverting_gradients_full.yaml \
	      --model user_convnet.UserConvNet --seed_everything $$seed --attack.init_args.progress_bar false \
	      --output_dir $(OUT)/ig_user_s$$seed || exit 1; done && \
	  $(RUN_USER_NET) $(BIN)/lightning-fl attack -c configs/inverting_gradients_full.yaml \
	    --model user_convnet.UserConvNet --run.batches 1 --run.batch_size 8 --attack.init_args.progress_bar false \
	    --output_dir $(OUT)/ig_user_b8 && \
	  $(RUN_USER_NET) $(BIN)/lightning-fl fit -c configs/fit_convnet_photos.yaml \
	    --model user_convnet.UserConvNet --loop.eval_metric test_accuracy --output_dir $(OUT)/fit_user_photos && \
	  $(RUN_USER_NET) $(BIN)/lightning-fl attack -c configs/inverting_gradients_full.yaml \
	    --model user_convnet.UserConvNet --run.batches 8 --attack.init_args.progress_bar false \
	    --ckpt_path $(OUT)/fit_user_photos/global_model.safetensors --output_dir $(OUT)/ig_user_trained && \
	  for seed in 0 1 2; do \
	    $(RUN) $(BIN)/lightning-fl attack -c configs/inverting_gradients_full.yaml $(CONVNET_IG) --seed_everything $$seed \
	      --attack.init_args.progress_bar false --output_dir $(OUT)/ig_full_s$$seed || exit 1; done && \
	  $(RUN) $(BIN)/lightning-fl fit -c configs/fit_convnet_photos.yaml --output_dir $(OUT)/fit_convnet_photos && \
	  $(RUN) $(BIN)/lightning-fl attack -c configs/inverting_gradients_full.yaml $(CONVNET_IG) --run.batches 2 \
	    --ckpt_path $(OUT)/fit_convnet_photos/global_model.safetensors --attack.init_args.progress_bar false \
	    --output_dir $(OUT)/ig_full_trained; } $(LOG)

reproduce-gpu: $(VENV)/.installed | $(OUT)
	{ $(RUN) PYTHON=$(BIN)/python bash benchmarks/gpu_attacks.sh $(OUT)/gpu && \
	  $(RUN) $(BIN)/python benchmarks/gpu_check.py --device cuda --out $(OUT)/gpu_check && \
	  $(RUN) PYTHON=$(BIN)/python bash benchmarks/gpu_vectorise.sh $(OUT)/gpu_vectorise && \
	  $(BIN)/lightning-fl bench --config configs/bench_photos_resnet.yaml --quick && \
	  $(RUN) $(BIN)/python benchmarks/dp_user_model.py --device cuda && \
	  { test -n "$(BREACHING_PATH)" || echo "gpu_breaching.sh skipped: give BREACHING_PATH=DIR (breaching 0.1.2)"; } && \
	  { test -z "$(BREACHING_PATH)" || \
	    PYTHON=$(BIN)/python BREACHING_PATH=$(BREACHING_PATH) bash benchmarks/gpu_breaching.sh $(OUT)/gpu_breaching; }; \
	} $(LOG)

reproduce-breaching:
	@test -n "$(BREACHING_PATH)" || { echo "give BREACHING_PATH=DIR:DEPS (breaching 0.1.2 and hydra-core)"; exit 2; }
	{ PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part labels && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part analytic && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part stg \
	    --batch-sizes 1 4 8 --seeds 3 --iterations 2000 && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part dlg \
	    --images 2 --iterations 100 --image-size 32 --sides breaching "ours matched" && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part ig \
	    --images 2 --iterations 2000 --image-size 32 --sides breaching "ours matched" && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part ig \
	    --backbone conv_bn_pool --image-size 32 --photographs 3 4 6 7 --images 4 --iterations 24000 \
	    --sides breaching "ours matched" "ours config" && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part dlg \
	    --backbone conv_bn_pool --image-size 32 --photographs 3 4 --images 2 --iterations 1200 \
	    --sides breaching "ours matched" && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/breaching_parity.py --part ig \
	    --backbone conv_bn_pool --image-size 32 --photographs 3 --images 1 --iterations 2000 \
	    --sides breaching "ours matched" && \
	  PYTHONPATH=$(CURDIR):$(BREACHING_PATH) OMP_NUM_THREADS=1 $(BIN)/python benchmarks/robbing_the_fed_parity.py; } $(LOG)

reproduce-grnn:
	{ $(RUN) $(BIN)/python benchmarks/grnn_tables.py && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/grnn_lenet_lfw.yaml --output_dir $(OUT)/grnn_lfw && \
	  $(RUN) $(BIN)/lightning-fl attack --config configs/model_inversion_fdlpp_digits.yaml --output_dir $(OUT)/mi_fdlpp; \
	} $(LOG)

reproduce-model-defences:
	$(RUN) $(BIN)/python benchmarks/defence_tables.py --images 4 $(LOG)

reproduce-model-defences-loop:
	{ $(RUN) $(BIN)/lightning-fl fit --config configs/fedkl_digits.yaml --output_dir $(OUT)/fedkl_digits && \
	  $(RUN) $(BIN)/lightning-fl fit --config configs/fdl_pp_digits.yaml --output_dir $(OUT)/fdl_pp_digits && \
	  $(RUN) $(BIN)/python benchmarks/fdl_pp_rounds.py; } $(LOG)

# docs/privacy.md: the DP tables, DP-FedAvg's clipping over 3 seeds, Fed-SDP stopped and resumed, DP on a user's model.
reproduce-dp:
	{ $(RUN) $(BIN)/python benchmarks/dp_tables.py --out $(OUT)/dp_tables.json && \
	  $(RUN) $(BIN)/python benchmarks/fed_dp_clients_per_round.py && \
	  $(RUN) $(BIN)/python benchmarks/fed_dp_clients_per_round.py --clients 100 --per-round 100 \
	    --defences fed_cdp none --seeds 0 && \
	  $(RUN) $(BIN)/python benchmarks/fed_dp_clients_per_round.py --per-round 20 --defences fed_cdp --local-epochs 5 \
	    --seeds 0 --out $(OUT)/fed_dp_clients_per_round/local_epochs_5 && \
	  for seed in 0 1 2; do \
	    $(RUN) $(BIN)/lightning-fl fit --config configs/dp_fedavg_adaptive_digits.yaml --seed_everything $$seed \
	      --output_dir $(OUT)/dpfa_adaptive_$$seed && \
	    $(RUN) $(BIN)/lightning-fl fit --config configs/dp_fedavg_adaptive_digits.yaml --seed_everything $$seed \
	      --output_dir $(OUT)/dpfa_fixed0.1_$$seed --defences.init_args.clip_learning_rate 0 && \
	    $(RUN) $(BIN)/lightning-fl fit --config configs/dp_fedavg_adaptive_digits.yaml --seed_everything $$seed \
	      --output_dir $(OUT)/dpfa_fixed1.0_$$seed --defences.init_args.clip_learning_rate 0 \
	      --defences.init_args.initial_clip 1.0 || exit 1; done && \
	  $(RUN) $(BIN)/lightning-fl fit -c configs/fed_sdp_digits.yaml --output_dir $(OUT)/sdp --overwrite true \
	    --loop.num_rounds 3 --loop.client_transforms.init_args.noise_multiplier 6.0 && \
	  $(RUN) $(BIN)/lightning-fl fit -c configs/fed_sdp_digits.yaml --output_dir $(OUT)/sdp --loop.num_rounds 4 \
	    --loop.client_transforms.init_args.noise_multiplier 0.1 --resume true && \
	  $(RUN) $(BIN)/python benchmarks/dp_user_model.py; } $(LOG)

reproduce-pogz:
	{ $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --allocations pogz even inverse && \
	  $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --nets paper2 --image-size 28 --epsilons 5 10 20 50 100 200 && \
	  $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --placements once --alpha-fraction 0.01 --epsilons 0.5 1 5 10 && \
	  $(RUN) $(BIN)/python benchmarks/pogz_table2_sweep.py --nets paper2 dlg3 --placements once per_step \
	    --clippings whole_update per_layer --seeds 3 --out $(OUT)/pogz_table2_sweep.json; \
	} $(LOG)

reproduce-fedboosting:
	{ $(RUN) $(BIN)/python benchmarks/fedboosting_tables.py && \
	  $(RUN) $(BIN)/python benchmarks/fedboosting_vs_fedavg.py --seeds 0 1 2 --alphas 0.3 1.0 \
	    --out $(OUT)/fedboosting_vs_fedavg; } $(LOG)

# docs/algorithms.md, "Measured: the quickstart under each algorithm" (eta 0.01, tau 1e-3 for the adaptive ones).
reproduce-algorithms:
	{ for a in FedAvg FedAvgM; do \
	    $(RUN) $(BIN)/lightning-fl fit --config configs/fedopt_digits.yaml --output_dir $(OUT)/fedopt_$$a \
	      --loop.aggregator "{class_path: lightning_fl.$$a}" --loop.client_callbacks '[]' || exit 1; done && \
	  for a in FedAdam FedYogi FedAdagrad; do \
	    $(RUN) $(BIN)/lightning-fl fit --config configs/fedopt_digits.yaml --output_dir $(OUT)/fedopt_$$a \
	      --loop.aggregator "{class_path: lightning_fl.$$a, init_args: {eta: 0.01, tau: 0.001}}" \
	      --loop.client_callbacks '[]' || exit 1; done && \
	  $(RUN) $(BIN)/lightning-fl fit --config configs/fedopt_digits.yaml --output_dir $(OUT)/fedopt_FedProx \
	    --loop.aggregator lightning_fl.FedAvg && \
	  $(RUN) $(BIN)/lightning-fl fit --config configs/fedopt_digits.yaml --output_dir $(OUT)/fedopt_config; } $(LOG)

# docs/secure_aggregation.md and docs/architecture.md: HE FedBoosting, Paillier and SecAgg costs, dropouts, faults.
reproduce-secure-aggregation:
	{ $(RUN) $(BIN)/lightning-fl fit --config configs/fedboosting_he_digits.yaml --output_dir $(OUT)/fedboosting_he && \
	  $(RUN) $(BIN)/python benchmarks/paillier.py --key-size 2048 --sample 1000 && \
	  $(RUN) $(BIN)/python benchmarks/secagg_cost.py --rounds 3 --paillier-rounds 1 && \
	  $(RUN) $(BIN)/python benchmarks/secagg_dropout.py --rounds 1 --drop-round 0 && \
	  $(RUN) $(BIN)/python benchmarks/secagg_dropout.py --rounds 4 --drop-round 3 && \
	  $(RUN) $(BIN)/python benchmarks/secagg_dropout.py --rounds 25 --drop-round 3 && \
	  $(RUN) $(BIN)/python benchmarks/faulty_updates.py; } $(LOG)

# docs/performance.md: timings (they depend on the machine and its load; the doc gives both for each table).
reproduce-performance:
	{ $(RUN) $(BIN)/python benchmarks/loop_overhead.py --rounds 10 --repeats 3 && \
	  $(RUN) $(BIN)/python benchmarks/cli_startup.py --repeats 3 && \
	  $(RUN) $(BIN)/python benchmarks/build_loop_cost.py --repeats 10 && \
	  $(RUN) $(BIN)/python benchmarks/vectorise_speed.py --clients 10 --per-round 5 --rounds 25 --repeats 3 && \
	  $(RUN) $(BIN)/python benchmarks/vectorise_speed.py --clients 100 --per-round 20 --rounds 25 --repeats 3 && \
	  $(RUN) $(BIN)/python benchmarks/vectorise_speed.py --clients 10 --per-round 5 --rounds 10 --repeats 3 --fed-cdp && \
	  $(RUN) $(BIN)/python benchmarks/vectorise_speed.py --layers --per-round 4 && \
	  $(RUN) $(BIN)/python benchmarks/vectorise_speed.py --layers --per-round 20 && \
	  $(RUN) $(BIN)/python benchmarks/scaling.py workers --workers 1 2 --rounds 3 --clients 20 && \
	  $(RUN) $(BIN)/python benchmarks/scaling.py memory --clients 1000 --per-round 100 --backbone lenet_dlg && \
	  $(RUN) $(BIN)/python benchmarks/scaling.py ddp --rounds 10 && \
	  $(RUN) $(BIN)/python benchmarks/scaling.py flower --rounds 25 && \
	  $(RUN) $(BIN)/python benchmarks/attack_speed.py && \
	  $(RUN) $(BIN)/python benchmarks/attack_speed.py --sweep 1 4 8 16 && \
	  $(RUN) $(BIN)/python benchmarks/dp_overhead.py --samples 500 --batch-size 5 --repeats 3 && \
	  $(RUN) $(BIN)/python benchmarks/dp_overhead.py --samples 500 --batch-size 32 --repeats 3; } $(LOG)

test: $(VENV)/.installed
	$(BIN)/ruff check lightning_fl tests benchmarks
	$(BIN)/ruff format --check lightning_fl tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/pytest -n 2 -m "not slow" --durations=20 tests
	OMP_NUM_THREADS=1 $(BIN)/pytest -p no:cacheprovider --doctest-modules lightning_fl -q

format: $(VENV)/.installed
	$(BIN)/ruff format lightning_fl tests benchmarks
	$(BIN)/ruff check --fix lightning_fl tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
