"""Who owns what the service is asked to act in, checked once, here, against SQL.

The service never takes a caller's word for it: not a user's (bearer token), and not the
internal token's either, whose holder names a user, a conversation and a workspace in the
body. Whatever does not exist and whatever belongs to someone else answer the same
``NotFound``, word for word, so ids cannot be probed.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from signalbox.services.proposals.errors import NotFound
from signalbox.shared.db import Conversation, User


def known_user(session: Session, user_id: str) -> User:
    """The user ``user_id``, else ``NotFound``."""
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"no user {user_id!r}")
    return user


def owned_conversation(
    session: Session, user_id: str, conversation_id: str, workspace: str | None
) -> Conversation:
    """``user_id``'s conversation ``conversation_id``, in ``workspace`` if one is named.

    Anything else is ``NotFound``: the conversation is the only record of which workspace a
    proposal may write, so a workspace other than the conversation's is never accepted.
    """
    conversation = session.get(Conversation, conversation_id)
    if (
        conversation is None
        or conversation.user_id != user_id
        or (workspace is not None and workspace != conversation.workspace)
    ):
        raise NotFound(
            f"no conversation {conversation_id!r} of user {user_id!r}"
            + ("" if workspace is None else f" in workspace {workspace!r}")
        )
    return conversation
