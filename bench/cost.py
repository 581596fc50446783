"""What prompt caching saves: billed input-token equivalents with caching against without.

The real loop (``run_turn``) and the real SDK (``AnthropicModel``) against the fake Messages
API, which honours ``cache_control`` by the API's rules (``tests/fake_prompt_cache.py``: its
proxy tokenizer, the 1,024-token minimum, the 20-block lookback). The tools are the
deployment's own workspace tools as offered to the model; their calls answer at once with a
file's worth of output. Each scenario runs twice, in fresh conversations: with caching (the
default), and with ``cache_control`` left out.

- ``cost@20_turns``: a conversation of 20 turns, each a ``read_file`` step then an answer.
- ``cost@sub_agents``: one turn that spawns three sub-agents, each reading three files.

A request is billed ``input + 1.25 x cache writes + 0.1 x cache reads`` input-token
equivalents (the API's 5-minute prices relative to input). Measured: the billed equivalents
per turn with caching; baseline: without. The target (issue 22): at least 5x fewer by the
20th turn. The sub-agent turn is reported without a target: each sub-agent's transcript
starts with its own task, so only its later steps can read what its earlier ones wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from bench.environment import DUMMY_API_KEY, BenchEnv
from bench.stats import Result, Series
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.loop import Runtime, run_turn
from signalbox.services.tools.workspace_tools import registry as workspace_registry
from signalbox.shared.db.models import Conversation, ModelRequest, Turn
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import OrchestratorSettings
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult, ToolSpec, publish_catalogue
from signalbox.shared.tool_contract import publish_result as publish_tool_result
from tests.fake_anthropic import Scripted, text, tool_use

WRITE_FACTOR, READ_FACTOR = 1.25, 0.1  # 5-minute cache write and cache read, x input price
TARGET_RATIO = 5.0
FILE_OUTPUT = "".join(
    f"{i:4d}  def handler_{i}(request): return respond(request, {i})\n" for i in range(60)
)


class AnsweringDispatcher:
    """Every tool call answers at once with a file's worth of output."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    def send(self, calls: Sequence[tuple[ToolCallRequest, ToolSpec]]) -> None:
        """Publish each call's result on the turn's result stream, as a tool worker would."""
        for request, _spec in calls:
            result = ToolResult(
                call_id=request.call_id, status="ok", output=FILE_OUTPUT, duration_ms=1
            )
            publish_tool_result(self.client, self.keys, request.turn_id, result)

    def revoke(self, call_ids: Sequence[str]) -> None:
        """Nothing runs long enough to revoke."""


@dataclass(frozen=True)
class Billed:
    """One turn's usage, as billed."""

    requests: int
    uncached_equivalent: float  # what the same prompts cost with no cache at all
    billed_equivalent: float
    cost_usd: float


def _runtime(env: BenchEnv, cached: bool, keys: RedisKeys) -> Runtime:
    model = AnthropicModel(
        DUMMY_API_KEY, env.fake.url, "bench", retry_backoff_s=0, cache_ttl="5m" if cached else None
    )
    settings = OrchestratorSettings(**{**env.settings_kwargs(), "redis_prefix": keys.prefix})
    return Runtime(
        settings=settings.model_copy(update={"max_steps": 10, "subagent_max_steps": 5}),
        sessions=env.sessions,
        redis=env.redis,
        keys=keys,
        model=model,
        dispatcher=AnsweringDispatcher(env.redis, keys),
        enqueue_turn=lambda _turn_id: None,
        poll_s=0.01,
        cancel_check_s=0.05,
    )


def _conversation(env: BenchEnv, user_id: str) -> str:
    with env.sessions() as s, s.begin():
        conv = Conversation(id=new_id("conv"), user_id=user_id, workspace="default", title="cost")
        s.add(conv)
    return conv.id


def _turn(env: BenchEnv, runtime: Runtime, user_id: str, conv_id: str, seq: int, text_: str) -> str:
    with env.sessions() as s, s.begin():
        turn = Turn(
            id=new_id("turn"),
            conversation_id=conv_id,
            user_id=user_id,
            seq=seq,
            text=text_,
            status="queued",
        )
        s.add(turn)
    outcome = run_turn(runtime, turn.id)
    if outcome != "completed":
        raise RuntimeError(f"cost: turn {seq} ended {outcome!r}")
    return turn.id


def _billed(env: BenchEnv, turn_id: str) -> Billed:
    with env.sessions() as s:
        rows = list(s.query(ModelRequest).filter(ModelRequest.root_turn_id == turn_id))
    prompt = sum(
        r.input_tokens + r.cache_creation_input_tokens + r.cache_read_input_tokens for r in rows
    )
    billed = sum(
        r.input_tokens
        + WRITE_FACTOR * r.cache_creation_input_tokens
        + READ_FACTOR * r.cache_read_input_tokens
        for r in rows
    )
    return Billed(len(rows), prompt, billed, sum(r.cost_usd or 0.0 for r in rows))


def _turn_script(i: int) -> list[Scripted]:
    return [
        [text(f"Let me read module {i}."), tool_use("read_file", {"path": f"src/mod{i}.py"})],
        [text(f"Module {i} defines 60 handlers; each answers through respond().")],
    ]


def _sub_agent_script() -> list[Scripted]:
    tasks = [f"summarise package {p}" for p in ("api", "store", "workers")]
    script: list[Scripted] = [
        [
            text("Three sub-agents, one per package."),
            *(tool_use("spawn_agent", {"task": t}) for t in tasks),
        ]
    ]
    for p in ("api", "store", "workers"):
        for f in range(3):
            script.append(
                [text(f"Reading {p}/f{f}."), tool_use("read_file", {"path": f"{p}/f{f}.py"})]
            )
        script.append([text(f"{p}: 180 handlers, all through respond().")])
    script.append([text("All three packages route every request through respond().")])
    return script


def _run(env: BenchEnv, cached: bool, turns: int, sub_agents: bool) -> list[Billed]:
    keys = RedisKeys(f"{env.keys.prefix}cost-{new_id('k')[-8:]}:")
    runtime = _runtime(env, cached, keys)
    publish_catalogue(env.redis, keys, "cost-bench", workspace_registry.specs(), 600)
    user_id, _token = env.user()
    conv_id = _conversation(env, user_id)
    billed = []
    for i in range(turns):
        env.fake.script(_sub_agent_script() if sub_agents else _turn_script(i))
        turn_id = _turn(
            env, runtime, user_id, conv_id, i + 1, f"question {i}: what is in module {i}?"
        )
        billed.append(_billed(env, turn_id))
    if env.fake.remaining:
        raise RuntimeError(f"cost: {env.fake.remaining} scripted replies left unused")
    return billed


def _result(
    variant: str, what: str, with_cache: list[Billed], without: list[Billed], targeted: bool
) -> Result:
    last_ratio = without[-1].billed_equivalent / with_cache[-1].billed_equivalent
    total_ratio = sum(b.billed_equivalent for b in without) / sum(
        b.billed_equivalent for b in with_cache
    )
    result = Result(
        id="cost",
        variant=variant,
        what=what,
        measured=Series(
            "billed input-token equivalents per turn, cached",
            [b.billed_equivalent for b in with_cache],
            unit="tokens",
        ),
        baseline=Series(
            "the same without cache_control", [b.billed_equivalent for b in without], unit="tokens"
        ),
        target=(
            f"≥ {TARGET_RATIO:g}x fewer billed input-token equivalents by the last turn"
            if targeted
            else "reported (no target: each sub-agent starts a transcript of its own)"
        ),
        met=last_ratio >= TARGET_RATIO if targeted else None,
    )
    result.notes.append(
        f"last turn: {last_ratio:.1f}x fewer billed input-token equivalents; "
        f"whole run: {total_ratio:.1f}x; cost ${sum(b.cost_usd for b in with_cache):.4f} "
        f"cached vs ${sum(b.cost_usd for b in without):.4f} uncached"
    )
    result.extra.update(
        {
            "ratio_last_turn": round(last_ratio, 3),
            "ratio_whole_run": round(total_ratio, 3),
            "ratio_per_turn": [
                round(w.billed_equivalent / c.billed_equivalent, 3)
                for c, w in zip(with_cache, without, strict=True)
            ],
            "requests": sum(b.requests for b in with_cache),
            "cost_usd_cached": round(sum(b.cost_usd for b in with_cache), 6),
            "cost_usd_uncached": round(sum(b.cost_usd for b in without), 6),
        }
    )
    return result


def cost(env: BenchEnv, quick: bool) -> list[Result]:
    """A 20-turn conversation and a sub-agent-heavy turn, with and without prompt caching."""
    turns = 4 if quick else 20
    conversation = _result(
        f"{turns}_turns",
        f"a {turns}-turn conversation, a read_file step and an answer per turn",
        _run(env, True, turns, False),
        _run(env, False, turns, False),
        targeted=True,
    )
    spawning = _result(
        "sub_agents",
        "one turn: three sub-agents of three read_file steps each, then an answer",
        _run(env, True, 1, True),
        _run(env, False, 1, True),
        targeted=False,
    )
    return [conversation, spawning]
