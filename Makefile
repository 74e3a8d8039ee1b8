# The two commands of the README. Each sets up .venv first (idempotent).
PY := .venv/bin/python
OUT ?= out

.PHONY: setup run test lint

setup:
	@bash scripts/setup.sh

# Main job: segment a bundled real photo; prints where the mask and overlay went.
run: setup
	$(PY) -m sam2edge segment sample:astronaut.png --point 270,180 --out $(OUT)/mask.png --overlay $(OUT)/overlay.png

# pytest-xdist workers (one torch thread each, tests/once.py shares the test-small exports between them)
TEST_WORKERS ?= 2

test: setup
	$(PY) -m ruff check sam2edge tests benchmarks scripts
	$(PY) -m ruff format --check sam2edge tests benchmarks scripts
	.venv/bin/lint-imports --no-cache
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile tests

# ruff, then the layering contract of pyproject.toml [tool.importlinter] (fails on an upward import or a cycle)
lint: setup
	$(PY) -m ruff check sam2edge tests benchmarks scripts
	$(PY) -m ruff format --check sam2edge tests benchmarks scripts
	.venv/bin/lint-imports --no-cache
