# The two commands: `make run` (set up and serve on http://127.0.0.1:8000) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.server-deps: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.test-deps: requirements.txt tests/requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r tests/requirements.txt
	touch $@ $(VENV)/.server-deps

# Settings come from the environment; a .env file, if present, is read first.
run: $(VENV)/.server-deps
	set -a; [ ! -f .env ] || . ./.env; set +a; \
	export PORT="$${PORT:-$(PORT)}"; \
	$(BIN)/python manage.py migrate --noinput && \
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0 && \
	$(BIN)/python manage.py ensureadmin && \
	echo "Serving on http://$(HOST):$$PORT/" && \
	exec $(BIN)/python -m chatsite.server -b $(HOST) -p "$$PORT" chatsite.asgi:application

test: $(VENV)/.test-deps
	tests/prepare.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

lint: $(VENV)/.test-deps
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.test-deps
	$(BIN)/python bench/stream_bench.py
