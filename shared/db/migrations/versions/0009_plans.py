"""plans the server executes (run_plan) and their steps

Revision ID: 0009_plans
Revises: 0008_uploads
Create Date: 2026-11-24 12:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0009_plans'
down_revision: str | None = '0008_uploads'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.add_column(sa.Column('plan_call_id', sa.String(length=40), nullable=True))
        batch_op.create_index(
            batch_op.f('ix_tool_calls_plan_call_id'), ['plan_call_id'], unique=False
        )
    op.create_table(
        'plan_steps',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('plan_call_id', sa.String(length=40), nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('save_as', sa.String(length=40), nullable=False),
        sa.Column('tool', sa.String(length=200), nullable=False),
        sa.Column('input', sa.JSON(), nullable=False),
        sa.Column('depends_on', sa.JSON(), nullable=False),
        sa.Column('level', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=20), nullable=False),
        sa.Column('call_id', sa.String(length=40), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['plan_call_id'], ['tool_calls.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('plan_call_id', 'save_as'),
    )
    with op.batch_alter_table('plan_steps', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_plan_steps_plan_call_id'), ['plan_call_id'], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table('plan_steps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_plan_steps_plan_call_id'))
    op.drop_table('plan_steps')
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tool_calls_plan_call_id'))
        batch_op.drop_column('plan_call_id')
