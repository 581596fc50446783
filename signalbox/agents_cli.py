"""``signalbox agents list|show|create|edit``: named, versioned agents (shared/agents.py).

Without ``--deployment`` it works as a user, through the gateway's ``/api/agents`` with
the SDK: the user's own agents (and, read-only, the deployment's). With ``--deployment``
it is an operator's command like ``signalbox users``: it writes deployment-wide agents,
which every user sees and none can change over the API, straight into
``SIGNALBOX_DATABASE_URL``.

``create`` takes the configuration from ``--file`` (JSON, or TOML for a ``.toml`` name),
``--config`` (JSON) and the flags, later ones winning; ``edit`` starts from the newest
version's configuration and changes what it is given, as a new version.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from signalbox.admin import AdminError, session_for
from signalbox.client import Client
from signalbox.shared.agents import AgentConfig
from signalbox.shared.db.agents import (
    AgentExists,
    FoundAgent,
    add_version,
    any_deployment_agent,
    create_agent,
    deployment_agents,
    find_in_scope,
)
from signalbox.shared.gateway_api import AgentView

Json = dict[str, Any]


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``agents`` subcommand and its actions."""
    agents = sub.add_parser("agents", help="list, show, create or edit agents")
    actions = agents.add_subparsers(dest="agents_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the agents I can use (or the deployment's)")
    show = actions.add_parser("show", help="an agent's newest version")
    show.add_argument("name")
    create = actions.add_parser("create", help="define an agent (version 1)")
    create.add_argument("name")
    edit = actions.add_parser("edit", help="a new version of an agent")
    edit.add_argument("name")
    for parser in (listing, show, create, edit):
        parser.add_argument(
            "--deployment",
            action="store_true",
            help="deployment-wide agents, in SIGNALBOX_DATABASE_URL (an operator's command)",
        )
        parser.add_argument("--url", help="gateway URL (as for `signalbox chat`)")
        parser.add_argument("--token", help="API token (as for `signalbox chat`)")
    for parser in (create, edit):
        parser.add_argument("--file", type=Path, help="the configuration, as JSON or TOML")
        parser.add_argument("--config", help="the configuration as a JSON object")
        parser.add_argument("--system-prompt", dest="system_prompt")
        parser.add_argument("--model")
        parser.add_argument("--mode", choices=["agent", "chat"])
        parser.add_argument("--tools", help="allow-list: names or fnmatch patterns, comma list")
        parser.add_argument("--max-steps", dest="max_steps", type=int)
        parser.add_argument("--max-sub-agents", dest="max_sub_agents", type=int)
        parser.add_argument("--max-output-tokens", dest="max_output_tokens", type=int)
        parser.add_argument("--thinking-budget", dest="thinking_budget_tokens", type=int)
        parser.add_argument("--turn-timeout", dest="turn_timeout_s", type=float)
        parser.add_argument(
            "--planner", action=argparse.BooleanOptionalAction, default=None, help="tool planner"
        )


_FLAGS = (
    "system_prompt",
    "model",
    "mode",
    "max_steps",
    "max_sub_agents",
    "max_output_tokens",
    "thinking_budget_tokens",
    "turn_timeout_s",
    "planner",
)


def config_from(args: argparse.Namespace) -> Json:
    """The configuration ``create``/``edit`` were given: file, then ``--config``, then flags."""
    given: Json = {}
    if args.file is not None:
        try:
            body = args.file.read_text(encoding="utf-8")
            raw = tomllib.loads(body) if args.file.suffix == ".toml" else json.loads(body)
        except (OSError, ValueError) as exc:
            raise AdminError(f"cannot read agent configuration {str(args.file)!r}: {exc}") from None
        given.update(_object(raw, str(args.file)))
    if args.config is not None:
        try:
            given.update(_object(json.loads(args.config), "--config"))
        except ValueError as exc:
            raise AdminError(f"--config is not JSON: {exc}") from None
    for flag in _FLAGS:
        value = getattr(args, flag)
        if value is not None:
            given[flag] = value
    if args.tools is not None:
        given["tools"] = [t.strip() for t in args.tools.split(",") if t.strip()]
    return given


def _object(raw: Any, source: str) -> Json:
    if not isinstance(raw, dict):
        raise AdminError(f"{source}: expected an object of agent settings")
    return raw


def _checked(config: Json) -> AgentConfig:
    try:
        return AgentConfig.model_validate(config)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise AdminError(f"not a valid agent: {problems}") from None


def _view(found: FoundAgent) -> AgentView:
    return AgentView(
        name=found.agent.name,
        version=found.version.version,
        scope="deployment" if found.deployment else "user",
        config=dict(found.version.spec),
        created_at=None,
        version_created_at=None,
    )


def print_agent(agent: AgentView, out: TextIO) -> None:
    """An agent as ``show``, ``create`` and ``edit`` print it."""
    print(f"{agent.name}  version {agent.version}  ({agent.scope})", file=out)
    print(json.dumps(agent.config, indent=2, sort_keys=True), file=out)


def run_deployment(database_url: str, args: argparse.Namespace, out: TextIO) -> int:
    """An action on deployment-wide agents, in SQL."""
    action = args.agents_command
    with session_for(database_url) as session:
        if action == "list":
            _print_list([_view(a) for a in deployment_agents(session)], out)
            return 0
        current = find_in_scope(session, None, args.name)
        if action == "show":
            if current is None:
                raise AdminError(f"no deployment agent named {args.name!r}")
            print_agent(_view(current), out)
        elif action == "create":
            try:
                current = create_agent(session, None, args.name, _checked(config_from(args)))
            except AgentExists as exc:
                raise AdminError(str(exc)) from None
            print_agent(_view(current), out)
        else:
            if current is None:
                raise AdminError(f"no deployment agent named {args.name!r}")
            config = _checked({**current.version.spec, **config_from(args)})
            version = add_version(session, current.agent, config)
            print_agent(_view(FoundAgent(current.agent, version)), out)
    return 0


def run_user(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """An action on the user's agents, over the gateway's API."""
    action = args.agents_command
    if action == "list":
        _print_list(client.agents(), out)
    elif action == "show":
        print_agent(client.agent(args.name), out)
    elif action == "create":
        print_agent(client.create_agent(args.name, config_from(args)), out)
    else:
        current = client.agent(args.name)
        if current.scope == "deployment":
            raise AdminError(
                f"agent {args.name!r} is deployment-wide: an operator edits it with --deployment"
            )
        print_agent(client.edit_agent(args.name, {**current.config, **config_from(args)}), out)
    return 0


def _print_list(agents: list[AgentView], out: TextIO) -> None:
    if not agents:
        print("no agents: `signalbox agents create NAME`", file=out)
    width = max((len(a.name) for a in agents), default=4)
    for a in agents:
        mode = a.config.get("mode", "agent")
        print(f"{a.name:<{width}}  v{a.version}  {a.scope:<10}  {mode}", file=out)


def run_agents(
    args: argparse.Namespace,
    database_url: Callable[[], str],
    client: Callable[[], Client],
    out: TextIO | None = None,
) -> int:
    """Do one ``agents`` action; the exit status (errors raise, as for the other commands)."""
    out = out or sys.stdout
    if args.deployment:
        return run_deployment(database_url(), args, out)
    with client() as api:
        return run_user(api, args, out)


CHAT_AGENT = "chat"  # the deployment agent `signalbox up` defines, so chat mode is one pick away


def ensure_chat_agent(database_url: str) -> bool:
    """Define the deployment agent ``chat`` (chat mode) unless an agent of that name was
    ever defined deployment-wide (an operator's archive stays archived); True if it did."""
    with session_for(database_url) as session:
        if any_deployment_agent(session, CHAT_AGENT):
            return False
        create_agent(session, None, CHAT_AGENT, AgentConfig(mode="chat"))
        return True
