# The two commands for a fresh machine: `make demo` and `make test`.
# Both set up .venv/ first (fast when it is already complete).
PY := .venv/bin/python

.PHONY: setup demo test bench

setup:
	bash scripts/setup_venv.sh

demo: setup
	$(PY) tools/analysis/backbone_summary.py configs/_base_/models/kcla-r50.py

test: setup
	$(PY) -m pytest tests -q

bench: setup
	$(PY) tools/analysis/benchmark_backbone.py --depth 50 --threads 1
