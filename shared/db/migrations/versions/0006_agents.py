"""agents: named, versioned agents; a conversation's bound version; a turn's planned tools

Revision ID: 0006_agents
Revises: 0005_proposal_reverts
Create Date: 2026-11-24 10:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0006_agents'
down_revision: str | None = '0005_proposal_reverts'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'agents',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('user_id', sa.String(length=40), nullable=True),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('archived_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('user_id', 'name'),
    )
    op.create_index(op.f('ix_agents_user_id'), 'agents', ['user_id'], unique=False)
    op.create_index(op.f('ix_agents_name'), 'agents', ['name'], unique=False)
    op.create_table(
        'agent_versions',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('agent_id', sa.String(length=40), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['agent_id'], ['agents.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('agent_id', 'version'),
    )
    op.create_index(
        op.f('ix_agent_versions_agent_id'), 'agent_versions', ['agent_id'], unique=False
    )
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('agent_version_id', sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column('agent_name', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('agent_version', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            'fk_conversations_agent_version_id', 'agent_versions', ['agent_version_id'], ['id']
        )
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tools_selected', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_column('tools_selected')
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.drop_constraint('fk_conversations_agent_version_id', type_='foreignkey')
        batch_op.drop_column('agent_version')
        batch_op.drop_column('agent_name')
        batch_op.drop_column('agent_version_id')
    op.drop_index(op.f('ix_agent_versions_agent_id'), table_name='agent_versions')
    op.drop_table('agent_versions')
    op.drop_index(op.f('ix_agents_name'), table_name='agents')
    op.drop_index(op.f('ix_agents_user_id'), table_name='agents')
    op.drop_table('agents')
