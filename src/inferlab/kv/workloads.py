"""Workload generators: the seed's chat, SGLang-style shared-prefix groups, multi-turn chats.

Token ids are drawn from a counter (each message gets fresh consecutive ids), so two prompts share
exactly the prefix the workload says they share, and nothing else.
"""

from __future__ import annotations

import random

from ..errors import InvalidValueError
from .simulator import Request
from .tokens import RunTokens


class _Ids:
    """Hands out fresh runs of token ids (1, 2, ...; id 0 unused)."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> RunTokens:
        r = RunTokens([(self.next, n)])
        self.next += n
        return r


def _check_counts(**kw: int) -> None:
    for name, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidValueError(f"{name} must be an integer >= 1, got {v!r}")


# The seed's chat, as chosen to reproduce its table (see inferlab.kv_managers.compare):
SEED_SYSTEM_TOKENS = 48
SEED_USERS = 4
SEED_FIRST_MESSAGE_TOKENS = 12  # each user's first message
SEED_REPLY_TOKENS = 16  # the reply to the first turn (known, so the second turn repeats it)
SEED_SECOND_MESSAGE_TOKENS = 27  # the follow-up message
SEED_SECOND_REPLY_TOKENS = 8
SEED_STAGGER_S = 4.0  # users start 4 steps apart
SEED_THINK_S = 30.0  # the second turn arrives 30 steps after the first


def seed_chat(*, system_tokens: int = SEED_SYSTEM_TOKENS, users: int = SEED_USERS,
              first_message_tokens: int = SEED_FIRST_MESSAGE_TOKENS, reply_tokens: int = SEED_REPLY_TOKENS,
              second_message_tokens: int = SEED_SECOND_MESSAGE_TOKENS,
              second_reply_tokens: int = SEED_SECOND_REPLY_TOKENS, stagger_s: float = SEED_STAGGER_S,
              think_s: float = SEED_THINK_S) -> list[Request]:
    """Four users, two turns each, one shared system prompt; turn 2 = turn 1 + reply + new message.

    User ``u``'s first turn arrives at ``u * stagger_s``, the second ``think_s`` later.
    Prompt tokens: ``users * (2 * (system + first) + reply + second)``.
    """
    _check_counts(system_tokens=system_tokens, users=users, first_message_tokens=first_message_tokens,
                  reply_tokens=reply_tokens, second_message_tokens=second_message_tokens,
                  second_reply_tokens=second_reply_tokens)
    ids = _Ids()
    system = ids.take(system_tokens)
    reqs = []
    for u in range(users):
        first = system + ids.take(first_message_tokens)
        reply = ids.take(reply_tokens)
        second = first + reply + ids.take(second_message_tokens)
        t1 = u * stagger_s
        reqs.append(Request(f"user{u}-turn1", t1, first, reply_tokens, output=reply))
        reqs.append(Request(f"user{u}-turn2", t1 + think_s, second, second_reply_tokens,
                            output=ids.take(second_reply_tokens)))
    reqs.sort(key=lambda r: r.arrival_s)
    return reqs


def shared_prefix_groups(*, num_groups: int = 64, prompts_per_group: int = 16, system_prompt_len: int = 2048,
                         question_len: int = 128, output_len: int = 256, ordered: bool = False,
                         seed: int = 0) -> list[Request]:
    """SGLang's ``generated-shared-prefix`` benchmark: groups of questions behind one system prompt.

    Defaults are SGLang's (64 x 16, system 2048, question 128, output 256 tokens). Requests all
    arrive at 0, shuffled unless ``ordered`` (use traces.retime for other arrivals).
    """
    _check_counts(num_groups=num_groups, prompts_per_group=prompts_per_group,
                  system_prompt_len=system_prompt_len, question_len=question_len, output_len=output_len)
    ids = _Ids()
    prompts = []
    for g in range(num_groups):
        system = ids.take(system_prompt_len)
        for q in range(prompts_per_group):
            prompts.append((f"g{g}-q{q}", system + ids.take(question_len)))
    if not ordered:
        random.Random(seed).shuffle(prompts)
    return [Request(rid, 0.0, p, output_len) for rid, p in prompts]


def multi_turn_chats(*, num_chats: int = 16, turns: int = 4, system_tokens: int = 256, user_tokens: int = 64,
                     reply_tokens: int = 128, interval_s: float = 2.0, think_s: float = 30.0,
                     shared_system: bool = True, seed: int = 0) -> list[Request]:
    """Conversations: turn ``k`` repeats turns ``< k`` and their replies, then a new message.

    Message and reply lengths vary uniformly in [0.5, 1.5] times the given means; chat ``c``
    starts at ``c * interval_s``; each turn follows the previous one after ``think_s``.
    """
    _check_counts(num_chats=num_chats, turns=turns, system_tokens=system_tokens, user_tokens=user_tokens,
                  reply_tokens=reply_tokens)
    rng = random.Random(seed)
    ids = _Ids()

    def vary(mean: int) -> int:
        return max(1, round(mean * rng.uniform(0.5, 1.5)))

    shared = ids.take(system_tokens)
    reqs = []
    for c in range(num_chats):
        history = shared if shared_system else ids.take(system_tokens)
        for k in range(turns):
            prompt = history + ids.take(vary(user_tokens))
            n_out = vary(reply_tokens)
            reply = ids.take(n_out)
            reqs.append(Request(f"chat{c}-turn{k}", c * interval_s + k * think_s, prompt, n_out, output=reply))
            history = prompt + reply
    reqs.sort(key=lambda r: r.arrival_s)
    return reqs


WORKLOADS = {"seed-chat": seed_chat, "shared-prefix": shared_prefix_groups, "multi-turn": multi_turn_chats}
