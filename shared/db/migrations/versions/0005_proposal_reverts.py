"""proposal reverts: a revert proposal names the applied proposals it undoes

Revision ID: 0005_proposal_reverts
Revises: 0004_model_requests
Create Date: 2026-11-23 21:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0005_proposal_reverts'
down_revision: str | None = '0004_model_requests'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reverts', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.drop_column('reverts')
