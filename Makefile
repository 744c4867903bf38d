# The two commands: `make run` (set up and serve on http://127.0.0.1:8000) and `make test`;
# `make check` while working: ruff and the tests that are not marked browser, cluster or slow;
# `make lock` after changing requirements.txt, requirements-ldap.txt or tests/requirements.txt.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test check lint bench bench-deps bench-lock lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Installed from the lock files: every package, transitive ones too, at one version with
# its hashes, so a new release of a dependency changes nothing until `make lock` is run.
$(VENV)/.server-deps: requirements.lock | $(BIN)/python
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	touch $@

$(VENV)/.test-deps: requirements.lock requirements-ldap.lock tests/requirements.lock | $(BIN)/python
	$(BIN)/pip install --quiet --require-hashes -r tests/requirements.lock
	touch $@ $(VENV)/.server-deps

# Rewrite the lock files from requirements.txt and tests/requirements.txt, from PyPI alone
# (uv's default index, whatever extra indexes this machine's pip is set up with), for Python 3.11+ on any platform.
# Pins already in a lock file are kept where they still fit; `make lock LOCK_ARGS=--upgrade`
# moves every unpinned dependency to its newest release.
UV_COMPILE = env -u UV_INDEX -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_CONSTRAINT \
	$(BIN)/uv pip compile --quiet --no-config \
	--universal --python-version 3.11 --generate-hashes --custom-compile-command "make lock" $(LOCK_ARGS)
# The server's lock constrains the tests' one: the tests run on the very versions the server is locked to.
lock: | $(BIN)/python
	$(BIN)/pip install --quiet "$$(grep '^uv==' tests/requirements.txt)"
	$(UV_COMPILE) --output-file requirements.lock requirements.txt
	$(UV_COMPILE) --constraints requirements.lock --output-file requirements-ldap.lock requirements-ldap.txt
	$(UV_COMPILE) --constraints requirements.lock --output-file tests/requirements.lock tests/requirements.txt

# Settings come from the environment; a .env file, if present, fills what it does not set (chatsite/dotenv.py,
# as manage.py reads it).
run: $(VENV)/.server-deps
	eval "$$($(BIN)/python -m chatsite.dotenv)"; \
	export PORT="$${PORT:-$(PORT)}"; \
	[ -z "$$LDAP_SERVER_URI" ] || $(BIN)/pip install --quiet --require-hashes -r requirements-ldap.lock && \
	$(BIN)/python manage.py migrate --noinput && \
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0 && \
	$(BIN)/python manage.py ensureadmin && \
	echo "Serving on http://$(HOST):$$PORT/" && \
	exec $(BIN)/python -m chatsite.server -b $(HOST) -p "$$PORT" chatsite.asgi:application

# The tests run in parallel workers (pytest-xdist), each with its own test database and Redis prefix;
# a file's tests stay on one worker (its module-scoped servers and browsers start once), and the
# heaviest files are handed out first (tests/conftest.py). They mostly wait on servers in other
# processes: more workers than cores pays.
TEST_WORKERS ?= 4
PYTEST = $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# prepare.sh first: it installs the Debian packages python-ldap (requirements-ldap.txt) builds against.
# bench/.venv too: tests/views/test_litellm_client.py runs the real litellm client from it (litellm stays
# out of the tests' lock), and fails rather than skips without it (BENCH_VENV_REQUIRED).
test: | $(BIN)/python
	tests/prepare.sh
	$(MAKE) $(VENV)/.test-deps
	$(MAKE) bench/.venv/.deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	# Bytecode written once here, even where PYTHONDONTWRITEBYTECODE is set: every server a test starts
	# would otherwise compile the project's modules again (a few tenths of a second each, on a busy machine more).
	$(BIN)/python -m compileall -q -j 0 chat chatsite fakeupstream tests
	BENCH_VENV_REQUIRED=1 $(PYTEST) --durations=25

check: | $(BIN)/python
	tests/prepare.sh
	$(MAKE) $(VENV)/.test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(PYTEST) -m "not browser and not cluster and not slow"

lint: $(VENV)/.test-deps
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# bench/compare.py's peer (LiteLLM's proxy), its chart (matplotlib) and py-spy live in a venv of their
# own, bench/.venv, from bench/requirements.lock: never in the server's or the tests' locks.
bench/.venv/.deps: bench/requirements.lock
	$(PYTHON) -m venv bench/.venv
	# --no-deps: the lock holds the whole tree, and pip 23's resolver refuses LiteLLM's httpx[http2]
	# as unpinned once a newer httpx is out; pip check confirms the tree is whole.
	bench/.venv/bin/pip install --quiet --require-hashes --no-deps -r bench/requirements.lock
	bench/.venv/bin/pip check
	touch $@

bench-deps: bench/.venv/.deps

bench-lock: | $(BIN)/python
	$(BIN)/pip install --quiet "$$(grep '^uv==' tests/requirements.txt)"
	env -u UV_INDEX -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_CONSTRAINT $(BIN)/uv pip compile --quiet \
	--no-config --python-version 3.11 --generate-hashes --custom-compile-command "make bench-lock" $(LOCK_ARGS) \
	--output-file bench/requirements.lock bench/requirements.txt

# About 45 minutes: compare.py (~10, against LiteLLM too once `make bench-deps` has run), scaleout.py
# (two processes on PostgreSQL + Redis, ~2), soak.py (two rounds of 10 minutes), then the others.
bench: $(VENV)/.test-deps
	$(BIN)/python bench/compare.py
	$(BIN)/python bench/scaleout.py
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/stream_bench.py
	$(BIN)/python bench/server_bench.py
	$(BIN)/python bench/budget_bench.py
