"""model_requests: every model request's usage (tokens, prompt cache) and cost, by purpose

Revision ID: 0004_model_requests
Revises: 0003_conversation_archived
Create Date: 2026-11-23 20:30:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0004_model_requests'
down_revision: str | None = '0003_conversation_archived'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'model_requests',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('user_id', sa.String(length=40), nullable=False),
        sa.Column('conversation_id', sa.String(length=40), nullable=False),
        sa.Column('turn_id', sa.String(length=40), nullable=False),
        sa.Column('root_turn_id', sa.String(length=40), nullable=False),
        sa.Column('purpose', sa.String(length=20), nullable=False),
        sa.Column('model', sa.String(length=100), nullable=False),
        sa.Column('input_tokens', sa.Integer(), nullable=False),
        sa.Column('output_tokens', sa.Integer(), nullable=False),
        sa.Column('cache_creation_input_tokens', sa.Integer(), nullable=False),
        sa.Column('cache_read_input_tokens', sa.Integer(), nullable=False),
        sa.Column('cost_usd', sa.Float(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('model_requests', schema=None) as batch_op:
        for column in ('user_id', 'conversation_id', 'turn_id', 'root_turn_id', 'created_at'):
            batch_op.create_index(
                batch_op.f(f'ix_model_requests_{column}'), [column], unique=False
            )


def downgrade() -> None:
    op.drop_table('model_requests')
