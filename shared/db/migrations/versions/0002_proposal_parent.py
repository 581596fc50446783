"""proposal parent: a partial approval splits the approved files into a child proposal

Revision ID: 0002_proposal_parent
Revises: 0001
Create Date: 2026-11-24 09:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0002_proposal_parent'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_id', sa.String(length=40), nullable=True))
        batch_op.create_index(batch_op.f('ix_proposals_parent_id'), ['parent_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_proposals_parent_id'))
        batch_op.drop_column('parent_id')
