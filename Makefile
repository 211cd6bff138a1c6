# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint install install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

# The client package (SDK, MCP server, learner loop) installs editable, so that its console
# script `ferrum-memory-mcp` runs this checkout's code; its tests run with the rest.
$(VENV)/.installed-dev: requirements.txt requirements-dev.txt clients/python/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet -e ./clients/python
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Web (gunicorn), worker and beat on 127.0.0.1:8000 with the embedded defaults.
run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	$(BIN)/python manage.py init_broker
	@echo "Dev API key for this run: $$($(BIN)/python manage.py create_api_key dev --rotate)"
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start

# The whole suite, embedded and (where PostgreSQL and Redis answer) scaled out, with coverage.
test: install-dev
	VENV=$(VENV) scripts/test.sh

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
