"""The Signalbox Python SDK: the gateway's HTTP API and WebSocket, typed, sync and async.

```python
from signalbox.client import Client

with Client("http://127.0.0.1:8000", token) as sb:
    conversation = sb.create_conversation()
    sb.start_turn(conversation.conversation_id, "create hello.txt with Hello")
    for event in sb.stream(conversation.conversation_id):  # resumes by itself after a drop
        if event.kind == "proposal_created":
            sb.approve(event.data["proposal_id"])
        if event.kind == "turn_finished":
            break
```

Requests and frames are built from the models of ``shared/protocol.py`` and answers read
into those of ``shared/gateway_api.py``, ``shared/proposals_api.py`` and ``shared/events.py``.
"""

from signalbox.client.errors import (
    BadRequest,
    Conflict,
    ConnectionLost,
    NotFound,
    ReplayGap,
    SignalboxError,
    Unauthorized,
    Unreachable,
)
from signalbox.client.http import AsyncClient, Client
from signalbox.client.ws import (
    AsyncWebSocket,
    ConnectionState,
    ProposalAck,
    StateChange,
    TurnAck,
    WebSocket,
    ws_url,
)

__all__ = [
    "AsyncClient",
    "AsyncWebSocket",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionLost",
    "ConnectionState",
    "NotFound",
    "ProposalAck",
    "ReplayGap",
    "SignalboxError",
    "StateChange",
    "TurnAck",
    "Unauthorized",
    "Unreachable",
    "WebSocket",
    "ws_url",
]
