"""model context: compaction notes, a turn's deadline, a model request's outcome

Revision ID: 0007_model_context
Revises: 0006_agents
Create Date: 2026-11-24 10:30:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0007_model_context'
down_revision: str | None = '0006_agents'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'compactions',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('conversation_id', sa.String(length=40), nullable=False),
        sa.Column('turn_id', sa.String(length=40), nullable=False),
        sa.Column('through_seq', sa.Integer(), nullable=False),
        sa.Column('turns_folded', sa.Integer(), nullable=False),
        sa.Column('summary', sa.Text(), nullable=False),
        sa.Column('tokens_before', sa.Integer(), nullable=False),
        sa.Column('tokens_after', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index(
        op.f('ix_compactions_conversation_id'), 'compactions', ['conversation_id'], unique=False
    )
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('model_requests', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('outcome', sa.String(length=20), nullable=False, server_default='ok')
        )


def downgrade() -> None:
    with op.batch_alter_table('model_requests', schema=None) as batch_op:
        batch_op.drop_column('outcome')
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_column('deadline_at')
    op.drop_index(op.f('ix_compactions_conversation_id'), table_name='compactions')
    op.drop_table('compactions')
