"""budgets, quotas and the admin role

Revision ID: 0012_tenancy
Revises: 0011_schedules
Create Date: 2026-11-24 12:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0012_tenancy'
down_revision: str | None = '0011_schedules'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('is_admin', sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_table(
        'user_limits',
        sa.Column('user_id', sa.String(length=40), nullable=False),
        sa.Column('day_tokens', sa.Integer(), nullable=True),
        sa.Column('month_tokens', sa.Integer(), nullable=True),
        sa.Column('quotas', sa.JSON(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.PrimaryKeyConstraint('user_id'),
    )
    op.create_table(
        'budget_warnings',
        sa.Column('user_id', sa.String(length=40), nullable=False),
        sa.Column('period', sa.String(length=8), nullable=False),
        sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.PrimaryKeyConstraint('user_id', 'period', 'period_start'),
    )


def downgrade() -> None:
    op.drop_table('budget_warnings')
    op.drop_table('user_limits')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_column('is_admin')
