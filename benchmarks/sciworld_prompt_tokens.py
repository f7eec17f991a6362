"""A ScienceWorld turn's prompt tokens, split into the part shared by every prompt, the part fixed for an episode and
the part new at each turn, for each prompt layout (lightning_epo/envs/sciworld_prompt.py) and history length.

    python benchmarks/sciworld_prompt_tokens.py [--tasks short|all|NAME ...] [--variations 1] [--sampled 1]
        [--history 0 1 2 actions transcript]

Episodes: each task's gold path (``SciWorldSuite``, easy simplification, gold paths on) on its first ``--variations``
train variations, and ``--sampled`` paths of ``--sampled-steps`` random actions (a random template of the task filled
with objects present) on the next ones. Every turn's prompt is built with ``PromptBuilder`` as the collector builds it (the history
the collector keeps, ``think`` off as for SmolLM2) and tokenized with the model's chat template
(``--model``, default SmolLM2-135M-Instruct: ``make smollm2``); ``--history actions`` is history 0 with
``env.prompt.actions_only`` (every earlier action, no observation), ``--history transcript`` history 0 with
``env.prompt.transcript`` (each turn's prompt the previous turn's prompt and answer, then the new message). For one
layout and history length:

- ``shared``: the longest token prefix common to every prompt of every episode (the chat template, the intro, ...);
- ``fixed``: the longest token prefix common to the prompts of one episode, less ``shared`` (its mean over
  episodes): computed once per episode by a prefix cache;
- ``fresh``: the rest of a turn's prompt (mean and max over turns): what each turn computes anew (with ``transcript``
  all that follows the first turn's prompt: a prefix cache holding the previous turn computes only its answer and
  the new message).

``total`` is the prompt's length before the collector's cut to ``model.max_prompt_tokens`` (2048 for SmolLM2), with
the number of turns above that limit. The table also gives the gold path's length per task, and what a trained row
costs the update's decoders, ``update``: the positions they compute a row (``Sharing.decoder_positions``, padding
included) when the episodes, each turn's prompt with its gold or sampled answer, are cut into RL steps of
``--episodes-per-step`` as the SmolLM2 recipes cut them (``--mini-batches``, ``algo.micro_batch_tokens``
``--budget``, ``model.shared_prefix`` and ``model.fold_turns`` on), mini-batches of rows against whole episodes
(``algo.batch_by_episode``).
"""

from __future__ import annotations

import argparse
import ast
import random
import statistics
import time
from pathlib import Path

from lightning_epo.envs.base import Task
from lightning_epo.envs.sciworld import SciWorldEnv, SciWorldSuite
from lightning_epo.models.loading import load_tokenizer
from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.rollout.episode import Episode, TurnSample
from lightning_epo.rollout.prompts import PromptBuilder
from lightning_epo.training.micro_batches import micro_batch_sharing, plan_micro_batches, step_mini_batches

REPO = Path(__file__).resolve().parents[1]
# the 9 tasks whose gold path (easy simplification) took at most 12 steps on one train variation; over more
# variations chemistry-mix-paint-secondary-color takes up to 34 (--variations 40)
SHORT_TASKS = [
    "find-non-living-thing", "lifespan-longest-lived", "lifespan-shortest-lived",
    "lifespan-longest-lived-then-shortest-lived", "chemistry-mix-paint-secondary-color", "find-animal",
    "find-living-thing", "find-plant", "power-component",
]
LAYOUTS = {  # name -> PromptBuilder's (fixed_first, action_list)
    "reference": (False, "full"),
    "fixed_first/full": (True, "full"),
    "fixed_first/compact": (True, "compact"),
    "fixed_first/none": (True, "none"),
}


def sampled_action(info: dict, rng: random.Random) -> str:
    """A random template of the task filled with objects present (what an untrained policy might write)."""
    *templates, objects_line = info["admissible_actions"]
    objects = ast.literal_eval(objects_line[objects_line.index("["):])
    template = rng.choice(templates)
    while "OBJ" in template or "LOC" in template:
        slot = "OBJ" if "OBJ" in template else "LOC"
        template = template.replace(slot, rng.choice(objects) if objects else "door", 1)
    return template.replace("[on ", "on ").replace("]", "")


def play(env: SciWorldEnv, task: Task, gold: bool, steps: int, rng: random.Random) -> list[tuple[str, dict, str]]:
    """``(observation, info, action)`` of each turn: the gold path to its end (or ``steps``), or random actions."""
    observation, info = env.reset(task)
    turns = []
    for _ in range(steps):
        action = info.get("expert_action") if gold else sampled_action(info, rng)
        if action is None:
            break
        turns.append((observation, info, action))
        observation, _, done, info = env.step(action)
        if done:
            break
    return turns


def prompt_ids(builder: PromptBuilder, tokenizer, turns: list[tuple[str, dict, str]], answers: list[list[int]]
               ) -> list[list[int]]:
    """Each turn's prompt ids, with the history the collector keeps (rollout/collector.py ``_apply``), or with a
    transcript the previous turn's prompt and answer (``answers``: each turn's ids) continued (not cut to a limit)."""
    history: list[tuple[str, str]] = []
    prompts = []
    for step, (observation, info, action) in enumerate(turns):
        if builder.transcript and prompts:
            prompts.append(builder.continued_ids(tokenizer, prompts[-1], answers[step - 1], observation,
                                                 info["admissible_actions"]))
            continue
        text = builder.text(info["task"], observation, info["admissible_actions"], history, step)
        prompts.append(builder.token_ids(tokenizer, text))
        history.append((observation, action))
        if builder.history_needed is not None:
            del history[: max(0, len(history) - builder.history_needed)]
    return prompts


def common_prefix(rows: list[list[int]]) -> int:
    first, n = rows[0], min(len(r) for r in rows)
    return next((i for i in range(n) if any(r[i] != first[i] for r in rows)), n)


def update_positions(prompts: list[list[list[int]]], answers: list[list[list[int]]], by_episode: bool, budget: int,
                     episodes_per_step: int, mini_batches: int) -> float:
    """The decoder positions the update computes a row, over steps of ``episodes_per_step`` of the episodes whose
    turns' ``prompts`` and ``answers`` (token ids) are given, drawn in a shuffled order (tasks mixed, as a step of the
    recipe mixes them): one epoch of ``mini_batches`` mini-batches, micro-batches of at most ``budget`` tokens, the
    shared prefix and folded turns on (one process)."""
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)
    positions = rows = 0
    for start in range(0, len(order), episodes_per_step):
        step = order[start:start + episodes_per_step]
        episodes = [Episode(traj_id=j, group_id=j, task="", turns=[
            TurnSample(prompt, answer, traj_id=j, turn_idx=t, group_id=j)
            for t, (prompt, answer) in enumerate(zip(prompts[e], answers[e]))]) for j, e in enumerate(step)]
        batch = collate_episodes(episodes, pad_token_id=0)
        algo = {"ppo_epochs": 1, "mini_batches": mini_batches, "batch_by_episode": by_episode}
        (minis,), _ = step_mini_batches(batch.traj_ids, algo, seed=start)
        for micro_batches in plan_micro_batches(batch, minis, 1, budget, True, lambda t, op="sum": t, by_episode):
            for cut in micro_batches:
                mb = batch.select(cut)
                positions += micro_batch_sharing(mb, True, True, None).decoder_positions(*mb.input_ids.shape)
        rows += len(batch)
    return positions / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["short"], help="short (the 9), all (29) or task names")
    parser.add_argument("--variations", type=int, default=1, help="gold paths per task (its first train variations)")
    parser.add_argument("--sampled", type=int, default=1, help="sampled paths per task (second train variation)")
    parser.add_argument("--sampled-steps", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=200, help="gold paths are cut here")
    parser.add_argument("--history", nargs="+", default=["0", "1", "2"],
                        help="history lengths, actions or transcript")
    parser.add_argument("--model", default=str(REPO / "data" / "smollm2-135m-instruct"))
    parser.add_argument("--max-prompt-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes-per-step", type=int, default=8)
    parser.add_argument("--mini-batches", type=int, default=2)
    parser.add_argument("--budget", type=int, default=4096, help="algo.micro_batch_tokens")
    args = parser.parse_args()

    suite = SciWorldSuite()
    names = (SHORT_TASKS if args.tasks == ["short"] else list(suite.variations()) if args.tasks == ["all"]
             else args.tasks)
    tokenizer = load_tokenizer({"name_or_path": args.model})
    rng = random.Random(args.seed)
    env = SciWorldEnv(gold_path=True)
    episodes: dict[str, list[list[tuple[str, dict, str]]]] = {"gold": [], "sampled": []}
    gold_steps = {}
    began = time.perf_counter()
    try:
        for name in names:
            train = suite.variations()[name]["train"]
            gold_steps[name] = []
            for variation in train[: args.variations]:
                gold = play(env, Task("train", name, variation), True, args.max_steps, rng)
                gold_steps[name].append(len(gold))
                episodes["gold"].append(gold)
            for k in range(args.sampled):
                variation = train[(args.variations + k) % len(train)]
                episodes["sampled"].append(play(env, Task("train", name, variation), False, args.sampled_steps, rng))
    finally:
        env.close()
    played = time.perf_counter() - began

    print(f"model {args.model}; tasks: {len(names)}; episodes: {len(episodes['gold'])} gold, "
          f"{len(episodes['sampled'])} sampled ({args.sampled_steps} random actions); played in {played:.0f} s\n")
    print("gold path steps (min-max over the variations): " + ", ".join(
        f"{n} {min(s)}-{max(s)}" if min(s) != max(s) else f"{n} {s[0]}" for n, s in gold_steps.items()))
    answer_ids = {paths: [[tokenizer.encode(f"<action>{a}</action>", add_special_tokens=False)
                           + [tokenizer.eos_token_id] for _, _, a in turns] for turns in played_paths if turns]
                  for paths, played_paths in episodes.items()}
    answers = [len(ids) for turns in answer_ids["gold"] for ids in turns]
    print(f"gold answers (<action>...</action> and the stop token): {statistics.mean(answers):.1f} tokens on average, "
          f"{max(answers)} at most\n")
    header = (f"| paths | layout | history | turns | total mean [min, max] | over {args.max_prompt_tokens} | shared | "
              "fixed per episode (mean) | fresh per turn mean [max] | update a row: rows / by episode |")
    print(header)
    print("|---" * 10 + "|")
    for paths in ("gold", "sampled"):
        for history in args.history:
            for layout, (fixed_first, action_list) in LAYOUTS.items():
                actions_only, transcript = history == "actions", history == "transcript"
                builder = PromptBuilder("sciworld", history_length=0 if actions_only or transcript else int(history),
                                        think=False, fixed_first=fixed_first, action_list=action_list,
                                        actions_only=actions_only, transcript=transcript)
                per_episode = [prompt_ids(builder, tokenizer, turns, said)
                               for turns, said in zip((t for t in episodes[paths] if t), answer_ids[paths])]
                if not per_episode:
                    continue
                every = [p for prompts in per_episode for p in prompts]
                shared = common_prefix(every)
                fixed = [common_prefix(prompts) - shared if len(prompts) > 1 else 0 for prompts in per_episode]
                fresh = [len(p) - shared - f for prompts, f in zip(per_episode, fixed) for p in prompts
                         if len(prompts) > 1]
                lengths = [len(p) for p in every]
                over = sum(n > args.max_prompt_tokens for n in lengths)
                cost = [update_positions(per_episode, answer_ids[paths], by_episode, args.budget,
                                         args.episodes_per_step, args.mini_batches) for by_episode in (False, True)]
                print(f"| {paths} | {layout} | {history} | {len(every)} | {statistics.mean(lengths):.0f} "
                      f"[{min(lengths)}, {max(lengths)}] | {over} | {shared} | {statistics.mean(fixed):.0f} | "
                      f"{statistics.mean(fresh):.0f} [{max(fresh)}] | {cost[0]:.0f} / {cost[1]:.0f} |")


if __name__ == "__main__":
    main()
