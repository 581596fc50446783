"""fair scheduling: turn admission, per-user running limits and weights

Revision ID: 0013_fair_scheduling
Revises: 0012_tenancy
Create Date: 2026-11-24 12:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0013_fair_scheduling'
down_revision: str | None = '0012_tenancy'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('deployment', sa.String(length=100), nullable=True))
        batch_op.create_index('ix_turns_waiting', ['deployment', 'status', 'admitted_at'])
    # Turns already past queued were admitted in all but name; queued ones wait for a pass.
    op.execute("UPDATE turns SET admitted_at = created_at WHERE status <> 'queued'")
    with op.batch_alter_table('user_limits', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_running_turns', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('weight', sa.Integer(), nullable=True))
    lock = op.create_table(
        'admission_lock',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('passes', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.bulk_insert(lock, [{'id': 1, 'passes': 0}])


def downgrade() -> None:
    op.drop_table('admission_lock')
    with op.batch_alter_table('user_limits', schema=None) as batch_op:
        batch_op.drop_column('weight')
        batch_op.drop_column('max_running_turns')
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_index('ix_turns_waiting')
        batch_op.drop_column('deployment')
        batch_op.drop_column('admitted_at')
