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

.PHONY: setup setup-compat demo test test-compat lint bench backbone-summary

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

test: setup
	$(PY) -m pytest tests -q

test-compat: setup-compat
	$(PY_COMPAT) -m pytest tests -q

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
	$(PY) tools/analysis/backbone_summary.py configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py --cfg-options model.backbone.init_cfg=None
