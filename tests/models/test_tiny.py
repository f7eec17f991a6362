"""The tiny model: deterministic, atomic to build, and a tokenizer that loads exactly as it was trained."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

from lightning_epo.models import tiny
from lightning_epo.models.tiny import TOKENIZER_CORPUS, build_tiny_model, train_bpe

# Spaces, newlines, digits, punctuation, contractions, unicode and the ChatML special tokens.
SAMPLES = [
    "go north",
    "  two leading spaces, two trailing  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "The key is 12 steps north and 3 steps east. Wall to the west.",
    "3.14159 -42 +7 1e-6 2024-11-21 100%",
    "it's we're they'll I'd you've I'm he's",
    "punctuation!? (a) [b] {c} <d> 'e' \"f\" a_b-c/d\\e ~ # @ ^ & * = | ; :",
    "café naïve jalapeño — ¿qué? 温度 23°C ✓ 🙂",
    "<think> I should look around. </think> <action> open fridge 1 </action>",
    "<|im_start|>user\nmove apple 1 to countertop 2<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "",
]
NOT_NFC = "cafe\u0301"  # "é" decomposed: both tokenizers NFC-normalise it, so it cannot round-trip


def files(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def test_same_seed_builds_identical_files_and_another_seed_other_weights(tiny_model_path, tmp_path):
    again = files(build_tiny_model(tmp_path / "again"))  # the same build twice in one process: identical bytes
    assert again == files(Path(tiny_model_path))
    other = files(build_tiny_model(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert other["tokenizer.json"] == again["tokenizer.json"]


def test_directory_is_a_qwen2_chat_checkpoint(tiny_model_path):
    config = AutoConfig.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 2)
    assert config.num_key_value_heads == 1
    assert config.hidden_size // config.num_attention_heads == 32  # a head size vLLM's CPU attention runs
    assert isinstance(tokenizer, Qwen2Tokenizer)
    assert config.vocab_size == len(tokenizer)
    assert 1000 <= len(tokenizer) <= 4096
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert config.eos_token_id == tokenizer.eos_token_id
    assert (Path(tiny_model_path) / "model.safetensors").is_file()


def test_auto_tokenizer_encodes_like_the_raw_tokenizer_it_was_trained_as(tiny_model_path):
    auto = AutoTokenizer.from_pretrained(tiny_model_path)
    saved = Tokenizer.from_file(str(Path(tiny_model_path) / "tokenizer.json"))
    trained = train_bpe(TOKENIZER_CORPUS, vocab_size=2048)  # the pipeline the merges were learned under
    for text in [*SAMPLES, NOT_NFC]:
        ids = auto.encode(text, add_special_tokens=False)
        assert ids == saved.encode(text).ids, text
        assert ids == trained.encode(text).ids, text
    for text in SAMPLES:
        assert auto.decode(auto.encode(text, add_special_tokens=False)) == text
    specials = auto.encode("<|endoftext|><|im_start|><|im_end|>", add_special_tokens=False)
    assert specials == [0, 1, 2]
    assert [auto.convert_ids_to_tokens(i) for i in auto.encode("42", add_special_tokens=False)] == ["4", "2"]


def test_chat_template_ends_with_the_assistant_prefix(tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [{"role": "user", "content": "go north"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, *messages]
    text = tokenizer.apply_chat_template(with_system, add_generation_prompt=False, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ngo north<|im_end|>\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    prefix = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert prefix[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert list(ids[-len(prefix) :]) == prefix


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(tiny, "random_qwen2", crash)  # after the tokenizer was written to the staging dir
    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_tiny_model(tmp_path / "tiny")
    assert list(tmp_path.iterdir()) == []


def test_existing_directory_is_never_overwritten(tmp_path):
    (tmp_path / "tiny").mkdir()
    with pytest.raises(FileExistsError, match="delete it to rebuild"):
        build_tiny_model(tmp_path / "tiny")


def test_concurrent_build_keeps_the_first_published_model(tmp_path, monkeypatch):
    path = tmp_path / "tiny"
    real = tiny.random_qwen2

    def another_rank_publishes_first(*args, **kwargs):
        model = real(*args, **kwargs)
        path.mkdir()
        (path / "config.json").write_text("{}")
        return model

    monkeypatch.setattr(tiny, "random_qwen2", another_rank_publishes_first)
    assert build_tiny_model(path) == path
    assert [f.name for f in path.iterdir()] == ["config.json"]
    assert [f.name for f in tmp_path.iterdir()] == ["tiny"]
