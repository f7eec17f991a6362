"""``model=tiny``: a randomly initialised Qwen2 model with its own small BPE tokenizer, built locally in seconds.

The directory looks like a real Qwen2.5-Instruct checkpoint to every loader (``config.json`` of model type
``qwen2``, ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json`` naming ``Qwen2Tokenizer``,
Qwen2.5-Instruct's ChatML chat template, eos ``<|im_end|>``, pad ``<|endoftext|>``), so the tiny model goes
through exactly the ``from_pretrained`` path the 3B/7B models use.

The pitfall this file guards against: ``AutoTokenizer`` on a Qwen2 checkpoint builds ``Qwen2Tokenizer``, which
takes only the vocabulary and merges from ``tokenizer.json`` and rebuilds the normalizer (NFC) and
pre-tokenizer (Qwen2's split regex, then byte-level without its own regex) itself. The BPE is therefore trained
with that very pipeline, so the raw ``tokenizers`` file and the transformers tokenizer give the same ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

from lightning_epo.models.export import staged_directory

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_CORPUS = REPO_ROOT / "data" / "tokenizer_corpus.txt"
DEFAULT_TINY_MODEL_DIR = REPO_ROOT / "data" / "tiny_model"  # gitignored
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2

# Qwen2.5-Instruct's chat template, verbatim (tokenizer_config.json of Qwen/Qwen2.5-{3B,7B}-Instruct).
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501


def train_bpe(corpus: Path, vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on ``corpus`` with Qwen2's normalizer and pre-tokenizer (see the module docstring)."""
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train([str(corpus)], trainer)
    return bpe


def build_tokenizer(corpus: Path, vocab_size: int) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` over a BPE trained on ``corpus``, configured like Qwen2.5-Instruct's."""
    bpe_model = json.loads(train_bpe(corpus, vocab_size).to_str())["model"]
    return Qwen2Tokenizer(
        vocab=bpe_model["vocab"],
        merges=[tuple(merge) for merge in bpe_model["merges"]],
        unk_token=None,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[IM_START, IM_END],
        chat_template=QWEN25_CHAT_TEMPLATE,
        errors="replace",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def random_qwen2(
    tokenizer: Qwen2Tokenizer,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    init_std: float,
    seed: int,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM (tied embeddings, like Qwen2.5-0.5B/3B); global RNG untouched."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        initializer_range=init_std,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    stop_at_chat_end(model, tokenizer)
    return model


def stop_at_chat_end(model: torch.nn.Module, tokenizer: Qwen2Tokenizer) -> None:
    """As Qwen2.5-Instruct's generation_config.json: ``model`` stops at <|im_end|> or <|endoftext|>."""
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id


# The build arguments that config.json does not show (vocab_size bounds the BPE, seed draws the weights), with their
# defaults: build_tiny_model records them there under "tiny_build", and the loader compares them to model.tiny.
RECORDED_BUILD_SETTINGS = {"vocab_size": 2048, "seed": 0}


def build_tiny_model(
    path: str | os.PathLike = DEFAULT_TINY_MODEL_DIR,
    *,
    vocab_size: int = RECORDED_BUILD_SETTINGS["vocab_size"],
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    init_std: float = 0.125,
    seed: int = RECORDED_BUILD_SETTINGS["seed"],
    corpus: str | os.PathLike = TOKENIZER_CORPUS,
) -> Path:
    """Train the tokenizer, random-init the model and save both (safetensors) under ``path``; returns ``path``.

    Deterministic given the arguments (same ``seed`` -> byte-identical files). ``vocab_size`` is an upper
    bound: BPE stops merging when the corpus has no pair left (1345 tokens for the shipped corpus).

    Atomic: everything is written to a temporary sibling directory that is renamed to ``path`` at the end,
    so an interrupted build leaves no half model. When another process (e.g. a second DDP rank) publishes
    ``path`` first, its build is kept and this one discarded.

    Raises:
        FileNotFoundError: ``corpus`` is missing.
        FileExistsError: ``path`` already exists (delete it to rebuild).
    """
    path, corpus = Path(path), Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"tokenizer corpus '{corpus}' not found: it ships in the repository's data/ folder")
    if path.exists():
        raise FileExistsError(f"tiny model directory '{path}' already exists: delete it to rebuild")
    with staged_directory(path) as staging:
        tokenizer = build_tokenizer(corpus, vocab_size)
        tokenizer.save_pretrained(staging)
        model = random_qwen2(
            tokenizer,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate_size,
            init_std=init_std,
            seed=seed,
        )
        model.config.tiny_build = {"vocab_size": vocab_size, "seed": seed}
        model.save_pretrained(staging)
    return path
