"""webhooks an owner registers, and their deliveries

Revision ID: 0010_webhooks
Revises: 0009_plans
Create Date: 2026-11-24 12:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0010_webhooks'
down_revision: str | None = '0009_plans'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'webhooks',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('user_id', sa.String(length=40), nullable=False),
        sa.Column('url', sa.String(length=2048), nullable=False),
        sa.Column('kinds', sa.JSON(), nullable=False),
        sa.Column('secret', sa.String(length=100), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhooks_user_id'), ['user_id'], unique=False)
    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('webhook_id', sa.String(length=40), nullable=False),
        sa.Column('event_key', sa.String(length=200), nullable=False),
        sa.Column('kind', sa.String(length=40), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_status_code', sa.Integer(), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['webhook_id'], ['webhooks.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('webhook_id', 'event_key'),
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_webhook_deliveries_webhook_id'), ['webhook_id'], unique=False
        )
        batch_op.create_index(
            batch_op.f('ix_webhook_deliveries_status'), ['status'], unique=False
        )
        batch_op.create_index(
            batch_op.f('ix_webhook_deliveries_next_attempt_at'), ['next_attempt_at'], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_next_attempt_at'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_status'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_webhook_id'))
    op.drop_table('webhook_deliveries')
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhooks_user_id'))
    op.drop_table('webhooks')
