# The two commands for a fresh machine: `make demo` and `make test`.
# Both set up .venv/ first (fast when it is already complete).
# `make test-compat` runs the same suite on the official KCLA stack
# (torch 2.1.2, .venv-torch21/); CI runs both.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PY := .venv/bin/python
PY_COMPAT := .venv-torch21/bin/python
DEMO_CONFIG := configs/kcla/demo/faster-rcnn_kcla-r18_fpn_synthetic-coco.py
DEMO_DATA := data/synthetic_coco
DEMO_WORK := work_dirs/demo
PRETRAIN_CONFIG := configs/kcla/demo/kcla-r18_1xb32_synthetic-imagenet.py
PRETRAIN_DATA := data/synthetic_imagenet
PRETRAIN_WORK := work_dirs/demo_pretrain

.PHONY: setup setup-compat demo demo-pretrain test test-quick test-no-extension test-compat test-gpu test-gpu-compat lint bench backbone-summary

setup:
	bash scripts/setup_venv.sh main

setup-compat:
	bash scripts/setup_venv.sh torch21

# Generate a synthetic COCO set, train Faster R-CNN with a KCLA-ResNet-18
# from scratch on CPU (about 7 minutes on 2 cores), then test it with
# mmdet's CocoMetric: the last lines give bbox mAP and mAP@0.5.
demo: setup
	$(PY) tools/misc/make_synthetic_coco.py $(DEMO_DATA) --train 200 --val 50 --size 256 --seed 0
	$(PY) tools/train.py $(DEMO_CONFIG) --work-dir $(DEMO_WORK) --cfg-options data_root=$(DEMO_DATA)
	$(PY) tools/test.py $(DEMO_CONFIG) $(DEMO_WORK)/epoch_12.pth --work-dir $(DEMO_WORK) --cfg-options data_root=$(DEMO_DATA) 2>&1 | tee $(DEMO_WORK)/test.log
	@grep -o 'coco/bbox_mAP: [0-9.]*\|coco/bbox_mAP_50: [0-9.]*' $(DEMO_WORK)/test.log | tail -n 2

# The pretraining demo, in the torch 2.1.2 stack (mmpretrain needs
# torchvision): generate an ImageNet-layout set of 8 shape/texture classes,
# test the untrained KCLA-ResNet-18 classifier (top-1 at chance, 12.5%),
# train it from scratch on CPU (about 4 minutes on 2 cores) and test it
# again with mmpretrain's Accuracy: the last two lines give top-1 before
# and after.
demo-pretrain: setup-compat
	$(PY_COMPAT) tools/misc/make_synthetic_imagenet.py $(PRETRAIN_DATA) --train 400 --val 40 --size 64 --seed 0
	mkdir -p $(PRETRAIN_WORK)
	$(PY_COMPAT) tools/misc/save_initial_checkpoint.py $(PRETRAIN_CONFIG) $(PRETRAIN_WORK)/initial.pth
	$(PY_COMPAT) tools/test.py $(PRETRAIN_CONFIG) $(PRETRAIN_WORK)/initial.pth --work-dir $(PRETRAIN_WORK)/before --cfg-options data_root=$(PRETRAIN_DATA) 2>&1 | tee $(PRETRAIN_WORK)/before.log
	$(PY_COMPAT) tools/train.py $(PRETRAIN_CONFIG) --work-dir $(PRETRAIN_WORK) --cfg-options data_root=$(PRETRAIN_DATA)
	$(PY_COMPAT) tools/test.py $(PRETRAIN_CONFIG) $(PRETRAIN_WORK)/epoch_15.pth --work-dir $(PRETRAIN_WORK)/after --cfg-options data_root=$(PRETRAIN_DATA) 2>&1 | tee $(PRETRAIN_WORK)/after.log
	@echo "before training: $$(grep -o 'accuracy/top1: [0-9.]*' $(PRETRAIN_WORK)/before.log | tail -n 1)"
	@echo "after training:  $$(grep -o 'accuracy/top1: [0-9.]*' $(PRETRAIN_WORK)/after.log | tail -n 1)"

test: setup
	$(PY) -m pytest tests -q

# The inner loop: everything but the tests marked slow (subprocess
# trainings, wheel builds, float64 R101 pairs); CI runs them all.
test-quick: setup
	$(PY) -m pytest tests -q -m 'not slow'

# The layer tests as on an install without the C++ kernels
# (no compiler): KCLA_MM_NO_EXTENSION=1 turns them off at run time, 'auto'
# then runs 'fused' and the kernels' own tests skip. CI runs it.
LAYER_TESTS := tests/test_kcla_layer.py tests/test_kcla_dispatch.py tests/test_kcla_fused.py tests/test_kcla_recompute.py tests/test_kcla_compiled.py tests/test_fused_block_tail.py tests/test_half_precision.py
test-no-extension: setup
	KCLA_MM_NO_EXTENSION=1 $(PY) -m pytest $(LAYER_TESTS) -q -m 'not slow'

test-compat: setup-compat
	$(PY_COMPAT) -m pytest tests -q

# The GPU lane: only the tests marked cuda (tests/test_cuda.py), on a
# machine with CUDA, on the main stack (test-gpu) or the torch 2.1.2 one
# (test-gpu-compat, whose PyPI torch has CUDA 12.1). `make test` collects
# them too and skips them on a CPU machine; the lane itself refuses to
# start where its torch sees no GPU (a CPU build of torch, no driver),
# since every test would skip and the lane would pass having run nothing.
REQUIRE_CUDA = -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make $@: torch " + torch.__version__ + " (CUDA " + str(torch.version.cuda) + ") sees no GPU, so every test of the GPU lane would skip")'
test-gpu: setup
	$(PY) $(REQUIRE_CUDA)
	$(PY) -m pytest tests -q -m cuda -rs

test-gpu-compat: setup-compat
	$(PY_COMPAT) $(REQUIRE_CUDA)
	$(PY_COMPAT) -m pytest tests -q -m cuda -rs

# flake8, isort and yapf with the OpenMMLab settings of setup.cfg (the
# checks of .pre-commit-config.yaml). `isort` and `yapf -i -r` fix in place.
LINT_PATHS := kcla_mm tools tests configs scripts setup.py
lint: setup
	.venv/bin/flake8 $(LINT_PATHS)
	.venv/bin/isort --check-only --diff $(LINT_PATHS)
	.venv/bin/yapf --diff --recursive $(LINT_PATHS)

bench: setup
	$(PY) tools/analysis/benchmark_backbone.py --depth 50 --threads 1

backbone-summary: setup
	$(PY) tools/analysis/backbone_summary.py configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py
