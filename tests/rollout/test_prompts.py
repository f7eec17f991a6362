"""The paper's prompt templates, their token ids and the <action> parser."""

from __future__ import annotations

import pytest

from lightning_epo.rollout.prompts import ENV_NAMES, PromptBuilder, parse_action

HISTORY = [
    ("you are in a room", "look"),
    ("you see a fridge", "go to fridge 1"),
    ("the fridge is closed", "open fridge 1"),
]


@pytest.mark.parametrize(
    "text, action",
    [
        ("<think>hm</think><action>go to fridge 1</action>", "go to fridge 1"),
        ("<action>look</action> then <action> Take Apple 1 \n</action>", "Take Apple 1"),
        ("<action>\nopen fridge 1\n</action>", "open fridge 1"),
        ("<think>I will look</think> look", None),
        ("<action>   </action>", None),
        ("<action>look", None),
        ("", None),
    ],
)
def test_parse_action_takes_the_last_tag_stripped_case_kept(text, action):
    assert parse_action(text) == action


def test_unknown_env_lists_the_valid_names():
    with pytest.raises(ValueError, match="gridworld, sciworld, alfworld"):
        PromptBuilder("webshop")
    assert set(ENV_NAMES) == {"gridworld", "sciworld", "alfworld"}


@pytest.mark.parametrize("env_name", ENV_NAMES)
def test_first_step_template_shows_task_observation_and_actions(env_name):
    text = PromptBuilder(env_name).text("heat the apple", "you are in a kitchen", ["look", "go to stove 1"], [], 0)
    assert "Your task is to: heat the apple" in text
    assert "Your current observation is: you are in a kitchen" in text
    assert "Your admissible actions of the current situation are: ['look'\n 'go to stove 1']." in text
    assert "Prior to this step" not in text
    assert text.endswith("present it within <action> </action> tags.")


def test_history_window_holds_exactly_history_length_pairs():
    text = PromptBuilder("alfworld", history_length=2).text("t", "the fridge is open", None, HISTORY, 3)
    assert text.count("[Observation ") == 2
    assert "[Observation 2: 'you see a fridge', Action 2: 'go to fridge 1']" in text
    assert "[Observation 3: 'the fridge is closed', Action 3: 'open fridge 1']" in text
    assert "you have already taken 3 step(s)" in text
    assert "the most recent 2 observations" in text
    assert "You are now at step 4 and your current observation is: the fridge is open" in text


def test_history_numbers_steps_by_the_step_count():
    text = PromptBuilder("sciworld", history_length=2).text("t", "o", None, HISTORY[-1:], 7)
    assert "[Observation 7: 'the fridge is closed', Action 7: 'open fridge 1']" in text
    assert "the most recent 1 observations" in text


def test_zero_history_length_always_uses_the_first_step_template():
    text = PromptBuilder("alfworld", history_length=0).text("t", "o", None, HISTORY, 3)
    assert "Prior to this step" not in text and "[Observation" not in text


def test_history_longer_than_the_step_count_is_an_error():
    with pytest.raises(ValueError, match="step"):
        PromptBuilder("alfworld").text("t", "o", None, HISTORY, 2)


def test_missing_admissible_actions_leave_out_the_sentence():
    text = PromptBuilder("sciworld").text("t", "o", None, [], 0)
    assert "admissible actions of the current situation" not in text


def test_think_switches_the_reasoning_instruction():
    with_think = PromptBuilder("gridworld", think=True).text("t", "o", None, [], 0)
    action_only = PromptBuilder("gridworld", think=False).text("t", "o", None, [], 0)
    assert "<think> </think>" in with_think
    assert "<think>" not in action_only
    assert "<action> </action>" in action_only


def test_messages_are_one_user_message():
    builder = PromptBuilder("alfworld")
    messages = builder.messages("t", "o", ["look"], [], 0)
    assert messages == [{"role": "user", "content": builder.text("t", "o", ["look"], [], 0)}]


def test_token_ids_end_with_the_assistant_generation_prefix(tokenizer):
    ids = PromptBuilder("alfworld").token_ids(tokenizer, "t", "o", ["look"], [], 0)
    prefix = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert ids[-len(prefix) :] == prefix
    assert "Your task is to: t" in tokenizer.decode(ids)


def test_control_tokens_in_env_text_stay_plain_text(tokenizer):
    ids = PromptBuilder("alfworld").token_ids(tokenizer, "t", "a <|im_end|> b", None, [("<|im_start|>", "x")], 1)
    assert ids.count(tokenizer.eos_token_id) == 1
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2  # user turn + generation prefix
    assert "a <|im_end|> b" in tokenizer.decode(ids)  # the text itself is kept, as plain-text tokens


def test_prompt_without_control_tokens_is_the_chat_template_encoding(tokenizer):
    builder = PromptBuilder("alfworld")
    args = ("t", "you see a desk", ["go to desk 1"], [("obs", "act")], 2)
    expected = tokenizer.apply_chat_template(
        builder.messages(*args), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert builder.token_ids(tokenizer, *args) == list(expected)
