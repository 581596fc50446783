"""schedules and alarms that start turns

Revision ID: 0011_schedules
Revises: 0010_webhooks
Create Date: 2026-11-24 12:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0011_schedules'
down_revision: str | None = '0010_webhooks'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'schedules',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('user_id', sa.String(length=40), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('interval_s', sa.Integer(), nullable=True),
        sa.Column('at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cron', sa.String(length=120), nullable=True),
        sa.Column('timezone', sa.String(length=64), nullable=False),
        sa.Column('active_from_hour', sa.Integer(), nullable=True),
        sa.Column('active_until_hour', sa.Integer(), nullable=True),
        sa.Column('prompt', sa.Text(), nullable=False),
        sa.Column('conversation_id', sa.String(length=40), nullable=True),
        sa.Column('workspace', sa.String(length=100), nullable=True),
        sa.Column('agent', sa.String(length=64), nullable=True),
        sa.Column('catch_up', sa.Boolean(), nullable=False),
        sa.Column('paused', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_tick_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_schedules_user_id'), ['user_id'], unique=False)
    op.create_table(
        'schedule_runs',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('schedule_id', sa.String(length=40), nullable=False),
        sa.Column('tick_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('conversation_id', sa.String(length=40), nullable=True),
        sa.Column('turn_id', sa.String(length=40), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('schedule_id', 'tick_at'),
    )
    with op.batch_alter_table('schedule_runs', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_schedule_runs_schedule_id'), ['schedule_id'], unique=False
        )
    op.create_table(
        'alarms',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('user_id', sa.String(length=40), nullable=False),
        sa.Column('conversation_id', sa.String(length=40), nullable=False),
        sa.Column('wake_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('note', sa.Text(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('set_by_turn_id', sa.String(length=40), nullable=True),
        sa.Column('turn_id', sa.String(length=40), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('fired_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('alarms', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_alarms_user_id'), ['user_id'], unique=False)
        batch_op.create_index(
            batch_op.f('ix_alarms_conversation_id'), ['conversation_id'], unique=False
        )


def downgrade() -> None:
    op.drop_table('alarms')
    op.drop_table('schedule_runs')
    op.drop_table('schedules')
