"""conversation archived_at: DELETE /api/conversations/{id} archives (hidden, no new turns)

Revision ID: 0003_conversation_archived
Revises: 0002_proposal_parent
Create Date: 2026-11-23 20:10:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0003_conversation_archived'
down_revision: str | None = '0002_proposal_parent'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('archived_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.drop_column('archived_at')
