"""The orchestrator: runs each turn's agent loop on the model API and fans tool calls out."""
