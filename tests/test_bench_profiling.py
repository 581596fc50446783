"""``bench.profiling.summarise``: what a py-spy recording says, on stacks through the focus."""

from __future__ import annotations

from bench.profiling import library, summarise

FOCUS = ("run_turn (signalbox/services/orchestrator/loop.py)",)
TURN = (
    "Thread 1 (idle): MainThread;run_turn (signalbox/services/orchestrator/loop.py:56);"
    "take_step (signalbox/services/orchestrator/model_step.py:90)"
)
# py-spy's raw format: frames joined by ';' (the thread first), then the sample count.
RECORDING = "\n".join(
    [
        # The SDK, and the HTTP client it called: all the SDK's.
        f"{TURN};Messages.create (anthropic/resources/messages/messages.py:900);"
        "Client.send (httpx2/_client.py:10);SyncStream.read (httpcore2/_backends/sync.py:5) 6",
        # SQL, through a helper of ours and back into SQLAlchemy.
        f"{TURN};store_step (signalbox/services/orchestrator/store.py:500);"
        "Connection.execute (sqlalchemy/engine/base.py:1494) 3",
        # Signalbox's own code at the leaf.
        f"{TURN};_tool_input (signalbox/services/orchestrator/anthropic_model.py:284) 1",
        # Generated code names no file: SQLAlchemy's constructors count as SQLAlchemy.
        f"{TURN};__init__ (<sqlalchemy generated __init__ for class signalbox.shared.db"
        ".models.ToolCall>:4) 2",
        # Not through the focus: a background thread, left out.
        "Thread 2 (idle): beat;Reconciler.sweep (signalbox/services/orchestrator/reconcile.py:1);"
        "Connection.execute (sqlalchemy/engine/base.py:1494) 50",
        "a line that is not a sample",
    ]
)


def test_a_cpu_profile_shares_its_samples_by_the_library_our_code_called() -> None:
    profile = summarise("orchestrator1", RECORDING, FOCUS, cpu=True)

    assert profile.samples == 12  # the background thread's 50 are not on the measured path
    assert profile.cpu
    assert dict(profile.libraries) == {
        "anthropic": 6 / 12,
        "sqlalchemy": 5 / 12,
        "signalbox": 1 / 12,
    }
    assert dict(profile.inclusive)["take_step (signalbox/services/orchestrator/model_step.py)"] == 1
    assert profile.to_json()["libraries"][0] == ["anthropic", 0.5]


def test_a_wall_clock_profile_has_no_library_table() -> None:
    profile = summarise("orchestrator1", RECORDING, FOCUS)

    assert not profile.cpu
    assert profile.libraries == []
    assert profile.self_time[0] == ("SyncStream.read (httpcore2/_backends/sync.py)", 6 / 12)


def test_library_names_the_top_level_package_or_stdlib_module() -> None:
    assert library("JSONEncoder.encode (json/encoder.py)") == "json"
    assert library("Condition.wait (threading.py)") == "threading"
    assert library("Celery.send_task (celery/app/base.py)") == "celery"
    assert library("run (/tmp/clone/signalbox/services/gateway/state.py)") == "signalbox"
    assert library("_find_and_load (<frozen importlib._bootstrap>)") == "frozen"
